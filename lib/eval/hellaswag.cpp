#include "eval/hellaswag.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <memory>
#include <random>

#include "core/error.h"
#include "core/finite.h"
#include "eval/kl_divergence.h"
#include "model/nonfinite.h"
#include "ops/ops.h"

namespace sq {

const char* task_order_name(TaskOrder order) { return order == TaskOrder::File ? "file" : "llamacpp"; }

TaskOrder parse_task_order(const std::string& name) {
  if (name == "file") return TaskOrder::File;
  if (name == "llamacpp") return TaskOrder::LlamaCpp;
  throw UsageError("--task-order must be 'file' or 'llamacpp', got '" + name + "'");
}

std::vector<HellaswagTask> select_hellaswag_tasks(const std::vector<HellaswagTask>& tasks, int64_t n, TaskOrder order) {
  const size_t count = (n <= 0 || static_cast<size_t>(n) > tasks.size()) ? tasks.size() : static_cast<size_t>(n);
  if (order == TaskOrder::File) return {tasks.begin(), tasks.begin() + static_cast<std::ptrdiff_t>(count)};
  // llama.cpp's hellaswag_score: a fresh distribution over the tasks still left, each draw removed.
  std::vector<HellaswagTask> left = tasks, chosen;
  chosen.reserve(count);
  std::mt19937 rng(1);
  for (size_t i = 0; i < count; ++i) {
    std::uniform_int_distribution<size_t> dist(0, left.size() - 1);
    const size_t k = dist(rng);
    chosen.push_back(std::move(left[k]));
    left.erase(left.begin() + static_cast<std::ptrdiff_t>(k));
  }
  return chosen;
}

HellaswagSequences tokenize_hellaswag_task(const HellaswagTask& task,
                                           const std::function<std::vector<int>(const std::string&)>& encode,
                                           const std::string& source) {
  HellaswagSequences s;
  s.index = task.index;
  s.line = task.line;
  s.gold = task.gold;
  size_t shortest = SIZE_MAX;
  for (size_t e = 0; e < 4; ++e) {
    const std::vector<int> ids = encode(task.context + " " + task.endings[e]);
    s.tokens[e].assign(ids.begin(), ids.end());
    shortest = std::min(shortest, ids.size());
  }
  size_t prefix = 0;
  while (prefix < shortest && s.tokens[0][prefix] == s.tokens[1][prefix] && s.tokens[0][prefix] == s.tokens[2][prefix] &&
         s.tokens[0][prefix] == s.tokens[3][prefix])
    ++prefix;
  // Every ending keeps at least one scored token (llama.cpp reads past a sequence that has none).
  prefix = std::min(prefix, shortest - 1);
  if (shortest < 2 || prefix == 0)
    throw InputError(source + ":" + std::to_string(task.line) + ": task " + std::to_string(task.index) +
                     ": context + ending tokenize to sequences that share no leading token, so no ending can be scored "
                     "after a common context");
  s.common_prefix = static_cast<int64_t>(prefix);
  return s;
}

void set_hellaswag_accuracy(HellaswagResult& r, int64_t correct, int64_t n) {
  r.tasks_scored = n;
  r.tasks_correct = correct;
  const double N = static_cast<double>(n), p = static_cast<double>(correct) / N;
  r.accuracy = p;
  r.accuracy_stderr = n > 1 ? std::sqrt(p * (1 - p) / (N - 1)) : 0.0;
  const double za = 1.95996398454, z = za * za / N;
  const double cnf = z * std::sqrt(N * (4.0 * p * (1 - p) + z)) / (za + za);
  r.ci95_low = (p + z * 0.5 - cnf) / (1.0 + z);
  r.ci95_high = (p + z * 0.5 + cnf) / (1.0 + z);
}

namespace {

/// One model's state on one thread: its KV cache, workspace and logits buffers.
struct ModelRun {
  ModelRun(const Decoder& m, int64_t capacity, const KVSpec& kv, const std::vector<NuqLayerParams>* params)
      : model(m), cache(m.config(), capacity, kv, params), kv(kv), params(params) {}
  const Decoder& model;
  KVCache cache;
  KVSpec kv;
  const std::vector<NuqLayerParams>* params;
  Workspace ws;
  std::vector<float> first;  ///< [vocab] logits after the common prefix
  std::vector<float> rows;   ///< [tokens of one ending − 1, vocab]
};

/// What one task contributes (combined in task order, so results do not depend on threads).
struct TaskOutcome {
  HellaswagTaskResult result;
  int64_t tokens = 0;
  double kld = 0, kld2 = 0, kld_max = 0;
  int64_t predictions = 0;
};

/// Throws the NonFiniteError of a task whose logits hold a NaN or ±Inf on `run`'s model: ending
/// `e`'s whole sequence is re-run layer by layer from an empty cache to name the layer.
[[noreturn]] void throw_nonfinite(ModelRun& run, const HellaswagSequences& t, int e, bool reference) {
  const std::vector<int32_t>& seq = t.tokens[static_cast<size_t>(e)];
  KVCache cache(run.model.config(), static_cast<int64_t>(seq.size()), run.kv, run.params);
  Workspace ws;
  const std::string where = std::string(reference ? "in the reference model " : "") + "at HellaSwag task " +
                            std::to_string(t.index) + " (line " + std::to_string(t.line) + ", ending " + std::to_string(e) + ")";
  throw nonfinite_activation_error(locate_nonfinite_activation(run.model, seq.data(), int64_t(seq.size()), cache, ws), where);
}

/// Runs the common prefix on `run` (fresh cache) into run.first.
void run_prefix(ModelRun& run, const HellaswagSequences& t, bool reference) {
  const int vocab = run.model.config().vocab_size;
  run.cache.clear();
  run.first.resize(static_cast<size_t>(vocab));
  run.model.forward(t.tokens[0].data(), t.common_prefix, run.cache, run.ws, run.first.data(), LogitsFor::LastToken);
  if (first_nonfinite_f32(run.first.data(), vocab) >= 0) throw_nonfinite(run, t, 0, reference);
}

/// Runs ending `e`'s tokens after the prefix but its last (their logits predict the ending's next
/// tokens) into run.rows, then drops them from the cache again; returns how many ran.
int64_t run_ending(ModelRun& run, const HellaswagSequences& t, int e, bool reference) {
  const std::vector<int32_t>& seq = t.tokens[static_cast<size_t>(e)];
  const int64_t m = static_cast<int64_t>(seq.size()) - t.common_prefix - 1;
  if (m <= 0) return 0;
  const int vocab = run.model.config().vocab_size;
  run.rows.resize(static_cast<size_t>(m) * static_cast<size_t>(vocab));
  run.model.forward(seq.data() + t.common_prefix, m, run.cache, run.ws, run.rows.data(), LogitsFor::AllTokens);
  run.cache.truncate(t.common_prefix);
  if (first_nonfinite_f32(run.rows.data(), m * vocab) >= 0) throw_nonfinite(run, t, e, reference);
  return m;
}

/// log p(target) under logits row [vocab] (the perplexity's log-sum-exp, ops::log_sum_exp).
double log_prob(const float* row, int vocab, int32_t target) { return double(row[target]) - ops::log_sum_exp(row, vocab); }

/// Mean log-probability of ending `e` from run.first and run.rows (run_ending just ran it).
double ending_score(const ModelRun& run, const HellaswagSequences& t, int e) {
  const std::vector<int32_t>& seq = t.tokens[static_cast<size_t>(e)];
  const int vocab = run.model.config().vocab_size;
  const int64_t c = t.common_prefix, n = static_cast<int64_t>(seq.size());
  double sum = log_prob(run.first.data(), vocab, seq[static_cast<size_t>(c)]);
  for (int64_t i = c + 1; i < n; ++i)
    sum += log_prob(run.rows.data() + static_cast<size_t>(i - c - 1) * vocab, vocab, seq[static_cast<size_t>(i)]);
  return sum / static_cast<double>(n - c);
}

int argmax4(const std::array<double, 4>& s) {
  int best = 0;
  for (int i = 1; i < 4; ++i)
    if (s[static_cast<size_t>(i)] > s[static_cast<size_t>(best)]) best = i;
  return best;
}

/// Scores one task on the model under test and, when given, the reference (in lockstep, so one
/// ending's logits of both are held at a time).
TaskOutcome score_task(const HellaswagSequences& t, ModelRun& test, ModelRun* ref) {
  TaskOutcome out;
  out.result.index = t.index;
  out.result.gold = t.gold;
  run_prefix(test, t, false);
  out.tokens += t.common_prefix;
  if (ref) run_prefix(*ref, t, true);
  const int vocab = test.model.config().vocab_size;
  auto add_kld = [&](const float* r, const float* x, int32_t target) {
    const double k = compare_token_logits(r, x, vocab, target).kld;
    out.kld += k;
    out.kld2 += k * k;
    out.kld_max = std::max(out.kld_max, k);
    ++out.predictions;
  };
  std::array<double, 4> ref_scores{};
  for (int e = 0; e < 4; ++e) {
    const int64_t m = run_ending(test, t, e, false);
    out.tokens += m;
    out.result.scores[static_cast<size_t>(e)] = ending_score(test, t, e);
    if (!ref) continue;
    run_ending(*ref, t, e, true);
    ref_scores[static_cast<size_t>(e)] = ending_score(*ref, t, e);
    const std::vector<int32_t>& seq = t.tokens[static_cast<size_t>(e)];
    const size_t c = static_cast<size_t>(t.common_prefix);
    add_kld(ref->first.data(), test.first.data(), seq[c]);
    for (int64_t j = 0; j < m; ++j)
      add_kld(ref->rows.data() + static_cast<size_t>(j) * vocab, test.rows.data() + static_cast<size_t>(j) * vocab,
              seq[c + 1 + static_cast<size_t>(j)]);
  }
  out.result.choice = argmax4(out.result.scores);
  if (ref) out.result.reference_choice = argmax4(ref_scores);
  return out;
}

}  // namespace

HellaswagResult evaluate_hellaswag(const Decoder& model, const std::vector<HellaswagSequences>& tasks,
                                   const HellaswagOptions& o) {
  if (tasks.empty()) throw UsageError("no HellaSwag task to evaluate");
  const ModelConfig& cfg = model.config();
  if (o.reference && o.reference->config().vocab_size != cfg.vocab_size)
    throw UsageError("the reference model has a vocabulary of " + std::to_string(o.reference->config().vocab_size) +
                     " tokens, the model under test " + std::to_string(cfg.vocab_size) + ": they must be equal");
  int64_t capacity = 0;
  for (const HellaswagSequences& t : tasks)
    for (const std::vector<int32_t>& seq : t.tokens) {
      const int64_t n = static_cast<int64_t>(seq.size());
      const int limit = o.reference ? std::min(cfg.max_seq_len, o.reference->config().max_seq_len) : cfg.max_seq_len;
      if (n > limit)
        throw UsageError("HellaSwag task " + std::to_string(t.index) + " (line " + std::to_string(t.line) + ") needs " +
                         std::to_string(n) + " tokens, more than the model's trained context of " + std::to_string(limit));
      capacity = std::max(capacity, n);
    }
  const int64_t count = static_cast<int64_t>(tasks.size());
  std::vector<TaskOutcome> outcomes(static_cast<size_t>(count));
  const auto t0 = std::chrono::steady_clock::now();
  // Small models: one task per thread (ops inside single-threaded); large models: tasks in order,
  // each op parallel (the cut-off of evaluate_perplexity).
  const bool task_parallel = cfg.dim < 1024 && omp_get_max_threads() > 1 && count > 1;
  std::atomic<int64_t> done{0}, tokens{0};
  // The first task (in order) that threw; later tasks are skipped, its exception is rethrown.
  std::atomic<int64_t> first_bad{INT64_MAX};
  std::vector<std::exception_ptr> errors(static_cast<size_t>(count));
  auto run_one = [&](int64_t i, ModelRun& test, ModelRun* ref) {
    if (i > first_bad.load(std::memory_order_relaxed)) return;
    try {
      outcomes[static_cast<size_t>(i)] = score_task(tasks[static_cast<size_t>(i)], test, ref);
    } catch (...) {
      errors[static_cast<size_t>(i)] = std::current_exception();
      int64_t cur = first_bad.load();
      while (i < cur && !first_bad.compare_exchange_weak(cur, i)) {
      }
      return;
    }
    tokens += outcomes[static_cast<size_t>(i)].tokens;
    const int64_t now = ++done;
    if (o.on_progress && (!task_parallel || omp_get_thread_num() == 0)) o.on_progress(now, count, tokens.load());
  };
  auto make_ref = [&]() {
    return o.reference ? std::make_unique<ModelRun>(*o.reference, capacity, KVSpec{}, nullptr) : nullptr;
  };
  if (task_parallel) {
#pragma omp parallel
    {
      ModelRun test(model, capacity, o.kv, o.kv_params);
      std::unique_ptr<ModelRun> ref = make_ref();
#pragma omp for schedule(dynamic)
      for (int64_t i = 0; i < count; ++i) run_one(i, test, ref.get());
    }
  } else {
    ModelRun test(model, capacity, o.kv, o.kv_params);
    std::unique_ptr<ModelRun> ref = make_ref();
    for (int64_t i = 0; i < count && first_bad.load() == INT64_MAX; ++i) run_one(i, test, ref.get());
  }
  if (first_bad.load() != INT64_MAX) std::rethrow_exception(errors[static_cast<size_t>(first_bad.load())]);

  HellaswagResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t correct = 0, ref_correct = 0, changed = 0, predictions = 0;
  double kld = 0, kld2 = 0, kld_max = 0;
  for (const TaskOutcome& t : outcomes) {
    r.tasks.push_back(t.result);
    r.tokens_processed += t.tokens;
    correct += t.result.correct();
    ref_correct += t.result.reference_choice == t.result.gold;
    changed += t.result.reference_choice != t.result.choice;
    kld += t.kld;
    kld2 += t.kld2;
    kld_max = std::max(kld_max, t.kld_max);
    predictions += t.predictions;
  }
  set_hellaswag_accuracy(r, correct, count);
  r.tokens_per_second = r.seconds > 0 ? static_cast<double>(r.tokens_processed) / r.seconds : 0.0;
  if (o.reference) {
    HellaswagComparison c;
    c.accuracy = static_cast<double>(ref_correct) / static_cast<double>(count);
    c.changed_choices = changed;
    c.predictions = predictions;
    std::tie(c.kld_mean, c.kld_stderr) = mean_and_stderr(kld, kld2, predictions);
    c.kld_max = kld_max;
    r.comparison = c;
  }
  if (o.on_progress) o.on_progress(count, count, r.tokens_processed);
  return r;
}

}  // namespace sq
