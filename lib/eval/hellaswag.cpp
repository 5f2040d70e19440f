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
#include "runtime/thread_governor.h"

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

/// Tasks [begin, end) scored as one batch (Decoder::forward_batch): their prefixes in one pass,
/// then all their endings in another.
struct Group {
  size_t begin, end;
};

/// Rows of one batch at most: enough for GEMMs to reuse each weight over many rows, and the
/// endings' logits ([rows, vocab] FP32) of one batch within 128 MiB (at least 32 rows).
constexpr int64_t kBatchRows = 512;
int64_t logit_rows_budget(int vocab) { return std::clamp<int64_t>((int64_t(1) << 25) / std::max(vocab, 1), 32, kBatchRows); }

int64_t ending_rows(const HellaswagSequences& t) {
  int64_t m = 0;
  for (const auto& seq : t.tokens) m += static_cast<int64_t>(seq.size()) - t.common_prefix - 1;
  return m;
}

/// Consecutive tasks grouped under the row budgets (each group at least one task); depends only on
/// the tasks and the vocabulary size, never on threads.
std::vector<Group> group_tasks(const std::vector<HellaswagSequences>& tasks, int vocab) {
  const int64_t logit_budget = logit_rows_budget(vocab);
  std::vector<Group> groups;
  size_t i = 0;
  while (i < tasks.size()) {
    Group g{i, i};
    int64_t prefix = 0, endings = 0;
    while (g.end < tasks.size()) {
      const HellaswagSequences& t = tasks[g.end];
      const int64_t p = prefix + t.common_prefix, e = endings + ending_rows(t);
      if (g.end > g.begin && (std::max(p, e) > kBatchRows || e > logit_budget)) break;
      prefix = p;
      endings = e;
      ++g.end;
    }
    groups.push_back(g);
    i = g.end;
  }
  return groups;
}

/// One model's state on one thread: a KV cache per task of a group, the workspace, and a group's
/// logits.
struct ModelRun {
  ModelRun(const Decoder& m, int64_t capacity, const KVSpec& kv, const std::vector<NuqLayerParams>* params)
      : model(m), capacity(capacity), kv(kv), params(params) {}
  const Decoder& model;
  int64_t capacity;
  KVSpec kv;
  const std::vector<NuqLayerParams>* params;
  std::vector<std::unique_ptr<KVCache>> caches;
  Workspace ws;
  std::vector<float> first;  ///< [tasks of the group, vocab] logits after each common prefix
  std::vector<float> rows;   ///< [ending rows of the group, vocab]: task by task, ending by ending
  KVCache& cache(size_t i) {
    while (caches.size() <= i) caches.push_back(std::make_unique<KVCache>(model.config(), capacity, kv, params));
    return *caches[i];
  }
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

/// Runs group g on `run`: the prefixes (run.first) then the endings but their last tokens
/// (run.rows), the endings' rows dropped from the caches again. Checks every logit.
void run_group(ModelRun& run, const std::vector<HellaswagSequences>& tasks, const Group& g, bool reference) {
  const int vocab = run.model.config().vocab_size;
  std::vector<SequenceBlock> blocks;
  for (size_t i = g.begin; i < g.end; ++i) {
    KVCache& cache = run.cache(i - g.begin);
    cache.clear();
    blocks.push_back({tasks[i].tokens[0].data(), tasks[i].common_prefix, &cache});
  }
  run.first.resize((g.end - g.begin) * static_cast<size_t>(vocab));
  run.model.forward_batch(blocks, BatchRows::Keep, run.ws, run.first.data(), LogitsFor::LastToken);
  blocks.clear();
  int64_t rows = 0;
  for (size_t i = g.begin; i < g.end; ++i)
    for (const auto& seq : tasks[i].tokens) {
      const int64_t m = static_cast<int64_t>(seq.size()) - tasks[i].common_prefix - 1;
      if (m > 0) blocks.push_back({seq.data() + tasks[i].common_prefix, m, &run.cache(i - g.begin)});
      rows += std::max<int64_t>(m, 0);
    }
  run.rows.resize(static_cast<size_t>(rows) * static_cast<size_t>(vocab));
  if (!blocks.empty()) run.model.forward_batch(blocks, BatchRows::Discard, run.ws, run.rows.data(), LogitsFor::AllTokens);
  // Non-finite logits: name the first task (and ending) that has them.
  const bool bad_first = first_nonfinite_f32(run.first.data(), int64_t(run.first.size())) >= 0;
  const bool bad_rows = first_nonfinite_f32(run.rows.data(), int64_t(run.rows.size())) >= 0;
  if (!bad_first && !bad_rows) return;
  int64_t r = 0;
  for (size_t i = g.begin; i < g.end; ++i) {
    const HellaswagSequences& t = tasks[i];
    if (first_nonfinite_f32(run.first.data() + (i - g.begin) * size_t(vocab), vocab) >= 0) throw_nonfinite(run, t, 0, reference);
    for (int e = 0; e < 4; ++e) {
      const int64_t m = std::max<int64_t>(int64_t(t.tokens[size_t(e)].size()) - t.common_prefix - 1, 0);
      if (first_nonfinite_f32(run.rows.data() + size_t(r) * size_t(vocab), m * vocab) >= 0) throw_nonfinite(run, t, e, reference);
      r += m;
    }
  }
  throw std::logic_error("HellaSwag: non-finite logits not found again");  // unreachable: the checks above cover every row
}

/// log p(target) under logits row [vocab] (the perplexity's log-sum-exp, ops::log_sum_exp).
double log_prob(const float* row, int vocab, int32_t target) { return double(row[target]) - ops::log_sum_exp(row, vocab); }

int argmax4(const std::array<double, 4>& s) {
  int best = 0;
  for (int i = 1; i < 4; ++i)
    if (s[static_cast<size_t>(i)] > s[static_cast<size_t>(best)]) best = i;
  return best;
}

/// Scores the tasks of group g from run_group's logits of the model under test and, when given,
/// of the reference.
void score_group(const std::vector<HellaswagSequences>& tasks, const Group& g, const ModelRun& test, const ModelRun* ref,
                 std::vector<TaskOutcome>& outcomes) {
  const int vocab = test.model.config().vocab_size;
  size_t row = 0;  // the group's first ending row of the current ending
  for (size_t i = g.begin; i < g.end; ++i) {
    const HellaswagSequences& t = tasks[i];
    TaskOutcome& out = outcomes[i];
    out = TaskOutcome{};
    out.result.index = t.index;
    out.result.gold = t.gold;
    out.tokens = t.common_prefix;
    const size_t c = static_cast<size_t>(t.common_prefix), f = (i - g.begin) * static_cast<size_t>(vocab);
    // The prefix's last row predicts every ending's first token: its log-sum-exp and KLD once.
    const float* first = test.first.data() + f;
    const float* ref_first = ref ? ref->first.data() + f : nullptr;
    const double lse0 = ops::log_sum_exp(first, vocab), ref_lse0 = ref ? ops::log_sum_exp(ref_first, vocab) : 0.0;
    const double kld0 = ref ? compare_token_logits(ref_first, first, vocab, t.tokens[0][c]).kld : 0.0;
    auto add_kld = [&](double k) {
      out.kld += k;
      out.kld2 += k * k;
      out.kld_max = std::max(out.kld_max, k);
      ++out.predictions;
    };
    std::array<double, 4> ref_scores{};
    for (size_t e = 0; e < 4; ++e) {
      const std::vector<int32_t>& seq = t.tokens[e];
      const size_t m = seq.size() - c - 1;
      out.tokens += static_cast<int64_t>(m);
      double sum = double(first[seq[c]]) - lse0, ref_sum = ref ? double(ref_first[seq[c]]) - ref_lse0 : 0.0;
      if (ref) add_kld(kld0);
      // Ending row j predicts token c + 1 + j of the ending's sequence.
      for (size_t j = 0; j < m; ++j) {
        const size_t off = (row + j) * static_cast<size_t>(vocab);
        const int32_t target = seq[c + 1 + j];
        sum += log_prob(test.rows.data() + off, vocab, target);
        if (!ref) continue;
        ref_sum += log_prob(ref->rows.data() + off, vocab, target);
        add_kld(compare_token_logits(ref->rows.data() + off, test.rows.data() + off, vocab, target).kld);
      }
      out.result.scores[e] = sum / static_cast<double>(m + 1);
      ref_scores[e] = ref_sum / static_cast<double>(m + 1);
      row += m;
    }
    out.result.choice = argmax4(out.result.scores);
    if (ref) out.result.reference_choice = argmax4(ref_scores);
  }
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
  const int limit = o.reference ? std::min(cfg.max_seq_len, o.reference->config().max_seq_len) : cfg.max_seq_len;
  for (const HellaswagSequences& t : tasks)
    for (const std::vector<int32_t>& seq : t.tokens) {
      const int64_t n = static_cast<int64_t>(seq.size());
      if (n > limit)
        throw UsageError("HellaSwag task " + std::to_string(t.index) + " (line " + std::to_string(t.line) + ") needs " +
                         std::to_string(n) + " tokens, more than the model's trained context of " + std::to_string(limit));
      capacity = std::max(capacity, n);
    }
  const int64_t count = static_cast<int64_t>(tasks.size());
  const std::vector<Group> groups = group_tasks(tasks, cfg.vocab_size);
  const int64_t n_groups = static_cast<int64_t>(groups.size());
  std::vector<TaskOutcome> outcomes(static_cast<size_t>(count));
  const auto t0 = std::chrono::steady_clock::now();
  // Small models: one group per thread (ops inside single-threaded, also for a single group, so
  // that the figures never depend on the thread count); large models: groups in order, each op
  // parallel (the cut-off of evaluate_perplexity).
  const bool group_parallel = cfg.dim < 1024 && threads::max_threads() > 1;
  std::atomic<int64_t> done{0}, tokens{0};
  // The first group (in order) that threw; later groups are skipped, its exception is rethrown.
  std::atomic<int64_t> first_bad{INT64_MAX};
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n_groups));
  auto run_one = [&](int64_t gi, ModelRun& test, ModelRun* ref) {
    if (gi > first_bad.load(std::memory_order_relaxed)) return;
    const Group& g = groups[static_cast<size_t>(gi)];
    try {
      run_group(test, tasks, g, false);
      if (ref) run_group(*ref, tasks, g, true);
      score_group(tasks, g, test, ref, outcomes);
    } catch (...) {
      errors[static_cast<size_t>(gi)] = std::current_exception();
      int64_t cur = first_bad.load();
      while (gi < cur && !first_bad.compare_exchange_weak(cur, gi)) {
      }
      return;
    }
    int64_t t = 0;
    for (size_t i = g.begin; i < g.end; ++i) t += outcomes[i].tokens;
    const int64_t toks = tokens += t;
    const int64_t now = done += int64_t(g.end - g.begin);
    if (o.on_progress && (!group_parallel || omp_get_thread_num() == 0)) o.on_progress(now, count, toks);
  };
  auto make_ref = [&]() {
    return o.reference ? std::make_unique<ModelRun>(*o.reference, capacity, KVSpec{}, nullptr) : nullptr;
  };
  if (group_parallel) {
#pragma omp parallel
    {
      ModelRun test(model, capacity, o.kv, o.kv_params);
      std::unique_ptr<ModelRun> ref = make_ref();
#pragma omp for schedule(dynamic)
      for (int64_t gi = 0; gi < n_groups; ++gi) run_one(gi, test, ref.get());
    }
  } else {
    ModelRun test(model, capacity, o.kv, o.kv_params);
    std::unique_ptr<ModelRun> ref = make_ref();
    for (int64_t gi = 0; gi < n_groups && first_bad.load() == INT64_MAX; ++gi) run_one(gi, test, ref.get());
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
