// Task accuracy on HellaSwag (Zellers et al. 2019), scored as llama.cpp's `llama-perplexity
// --hellaswag` (hellaswag_score in tools/perplexity/perplexity.cpp of llama.cpp 0c1e570): the
// "acc_norm" of lm-evaluation-harness, where each of a task's four endings is scored by the mean
// log-probability of its tokens after the context. Definitions: docs/protocols.md, "HellaSwag".
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "formats/hellaswag_file.h"
#include "model/decoder.h"
#include "quant/kv_codec.h"
#include "runtime/kv_format.h"

namespace sq {

/// Which tasks `--tasks N` selects.
enum class TaskOrder {
  File,      ///< the first N tasks, in file order (default)
  LlamaCpp,  ///< llama.cpp's draw: N times, task k of the R remaining is taken and removed, k from
             ///< std::uniform_int_distribution<size_t>(0, R − 1) over std::mt19937 seeded with 1.
             ///< The distribution's algorithm is the C++ library's (libstdc++ here and in llama.cpp
             ///< built with GCC), so it reproduces llama.cpp's subset and order only with libstdc++.
};

/// "file" / "llamacpp".
const char* task_order_name(TaskOrder order);
/// Parses "file" / "llamacpp"; throws UsageError otherwise.
TaskOrder parse_task_order(const std::string& name);

/// The tasks `--tasks n` evaluates (n ≤ 0 or ≥ the task count: all of them, in the order's
/// sequence: for LlamaCpp a permutation of the whole file).
std::vector<HellaswagTask> select_hellaswag_tasks(const std::vector<HellaswagTask>& tasks, int64_t n, TaskOrder order);

/// A task's four token sequences as llama.cpp forms them: tokenize(context + " " + ending_s) with
/// the tokenizer's own BOS, and their common prefix (the longest run of equal leading tokens of all
/// four, capped so that every sequence keeps at least one token after it; llama.cpp's behaviour is
/// undefined when a sequence has none).
struct HellaswagSequences {
  int64_t index = 0;  ///< HellaswagTask::index
  int64_t line = 0;   ///< HellaswagTask::line (errors name it)
  int gold = 0;
  std::array<std::vector<int32_t>, 4> tokens;
  int64_t common_prefix = 0;  ///< ≥ 1 (BOS or the first context token) unless a sequence is empty
};

/// Tokenizes one task with `encode` (text → ids, BOS added as the model's tokenizer does). Throws
/// InputError naming `source`, the task's line and index when the four sequences share no leading
/// token (then no ending can be scored after a common context).
HellaswagSequences tokenize_hellaswag_task(const HellaswagTask& task,
                                           const std::function<std::vector<int>(const std::string&)>& encode,
                                           const std::string& source);

/// The mean log-probability of each ending of one task (llama.cpp's `ending_logprob`): for ending
/// s with tokens t[0 … n_s) and common prefix c, (Σ_{i=c}^{n_s−1} log p(t[i] | t[0 … i))) / (n_s − c),
/// log p = logit − log-sum-exp of the FP32 logits (ops::log_sum_exp, as the perplexity's NLL).
struct HellaswagTaskResult {
  int64_t index = 0;
  int gold = 0;
  int choice = 0;                  ///< argmax of scores (the first on ties)
  std::array<double, 4> scores{};  ///< mean log-probability per ending (nats, ≤ 0)
  int reference_choice = -1;       ///< with a reference model: its choice, else −1
  bool correct() const { return choice == gold; }
};

/// The comparison with a reference model on the same tasks (HellaswagOptions::reference).
struct HellaswagComparison {
  double accuracy = 0;          ///< the reference's accuracy on the same tasks
  int64_t changed_choices = 0;  ///< tasks whose choice differs from the reference's
  int64_t predictions = 0;      ///< scored ending tokens over all tasks and endings
  double kld_mean = 0, kld_stderr = 0;  ///< KL(P_ref‖P_test) per scored ending token, nats
  double kld_max = 0;
};

struct HellaswagOptions {
  KVSpec kv;  ///< KV-cache format of the model under test (default FP32)
  /// Offline nuq parameters [n_layers] (from the .sqm); required for nuq formats, else ignored.
  const std::vector<NuqLayerParams>* kv_params = nullptr;
  /// When set, every task also runs on this model (dense FP32 KV cache); the result's `comparison`
  /// is filled. Must have the vocabulary size of the model under test (UsageError otherwise).
  const Decoder* reference = nullptr;
  /// Called from the evaluating thread with (tasks done, total tasks, tokens run so far).
  std::function<void(int64_t, int64_t, int64_t)> on_progress;
};

struct HellaswagResult {
  int64_t tasks_scored = 0, tasks_correct = 0;
  double accuracy = 0;         ///< tasks_correct / tasks_scored
  /// sqrt(p(1 − p) / (N − 1)), as llama.cpp's multiple-choice and Winogrande scores report it (0 for N = 1)
  double accuracy_stderr = 0;
  /// Wilson score 95% interval (z = 1.95996398454), as llama.cpp's --hellaswag log prints it
  double ci95_low = 0, ci95_high = 0;
  int64_t tokens_processed = 0;  ///< tokens run through the model under test (prefixes once, endings but their last token)
  double seconds = 0, tokens_per_second = 0;
  std::vector<HellaswagTaskResult> tasks;  ///< in evaluation order
  std::optional<HellaswagComparison> comparison;
};

/// Accuracy and its uncertainty (accuracy_stderr and the Wilson interval as documented on
/// HellaswagResult) of `correct` out of `n` tasks; n must be ≥ 1.
void set_hellaswag_accuracy(HellaswagResult& r, int64_t correct, int64_t n);

/// Scores every task on `model`: per task, the common prefix runs once from an empty KV cache in
/// options.kv's format, then each ending's tokens but its last run on top of it and are dropped
/// again (KVCache::truncate), so the prefix's keys and values are computed once as in llama.cpp's
/// shared-prefix batch. Small models (dim < 1024) run whole tasks on separate threads (ops inside
/// single-threaded), larger ones one task at a time with parallel ops; the result does not depend
/// on the thread count. Throws UsageError for no task, a task longer than the model's trained
/// context or a reference of another vocabulary size, NonFiniteError naming the task (its first
/// line) and layer when logits are NaN/±Inf, and what Decoder::forward throws.
HellaswagResult evaluate_hellaswag(const Decoder& model, const std::vector<HellaswagSequences>& tasks,
                                   const HellaswagOptions& options);

}  // namespace sq
