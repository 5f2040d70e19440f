#include "eval/perplexity.h"

#include <omp.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <memory>

#include "core/error.h"
#include "core/finite.h"
#include "eval/layer_major.h"
#include "model/layer_stream.h"
#include "model/nonfinite.h"
#include "ops/ops.h"
#include "runtime/thread_governor.h"

namespace sq {

const char* protocol_name(PplProtocol p) { return p == PplProtocol::Windows ? "windows" : "llamacpp"; }

PplProtocol parse_protocol(const std::string& name) {
  if (name == "windows") return PplProtocol::Windows;
  if (name == "llamacpp") return PplProtocol::LlamaCpp;
  throw UsageError("--protocol must be 'windows' or 'llamacpp', got '" + name + "'");
}

void check_scored_result(int64_t tokens_scored, double ppl, const std::string& source) {
  if (tokens_scored <= 0)
    throw InputError(source + ": no token was scored (the text is too short for the protocol and context length)");
  if (!std::isfinite(ppl))
    throw Error("perplexity is not finite (" + std::to_string(ppl) + ") over " + std::to_string(tokens_scored) +
                " scored tokens of " + source + ": the model produced non-finite logits");
}

int64_t perplexity_chunks(int64_t n_tokens, const PerplexityOptions& o) {
  int64_t chunks = o.ctx > 0 ? n_tokens / o.ctx : 0;
  if (o.max_chunks > 0 && chunks > o.max_chunks) chunks = o.max_chunks;
  return chunks;
}

namespace {

struct ChunkSums {
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  KVCacheBytes kv;  ///< the cache's bytes after the chunk
  bool nonfinite = false;  ///< the chunk's logits hold a NaN or ±Inf (sums not computed)
  std::vector<TokenComparison> cmp;  ///< with a reference model: its scored predictions, in order
};

/// The reference model's per-thread state: its dense FP32 cache, workspace and one chunk's logits.
struct ReferenceRun {
  ReferenceRun(const Decoder& m, int ctx) : model(m), cache(m.config(), ctx) {}
  const Decoder& model;
  KVCache cache;
  Workspace ws;
  std::vector<float> logits;
};

/// Throws UsageError for ctx < 2 or a text without one complete chunk; returns the chunk count.
int64_t checked_chunks(const std::vector<int32_t>& tokens, const PerplexityOptions& o) {
  if (o.ctx < 2) throw UsageError("context length must be at least 2 tokens, got " + std::to_string(o.ctx));
  if (o.protocol == PplProtocol::LlamaCpp && o.ctx < 3)
    throw UsageError("context length " + std::to_string(o.ctx) +
                     " scores no token under the llamacpp protocol (positions ctx/2 .. ctx-2 are scored); need at least 3");
  const int64_t chunks = perplexity_chunks(static_cast<int64_t>(tokens.size()), o);
  if (chunks == 0)
    throw UsageError("the text has " + std::to_string(tokens.size()) + " tokens, fewer than one chunk of " + std::to_string(o.ctx));
  return chunks;
}

/// The model input of chunk `chunk` per the protocol (llama.cpp replaces the first token by BOS).
void chunk_input(const std::vector<int32_t>& tokens, int64_t chunk, const PerplexityOptions& o, int32_t bos,
                 std::vector<int32_t>& input) {
  const int64_t start = chunk * o.ctx;
  input.assign(tokens.begin() + start, tokens.begin() + start + o.ctx);
  if (o.protocol == PplProtocol::LlamaCpp && o.replace_first_with_bos) input[0] = bos;
}

/// The first position of a chunk whose prediction is scored: ctx/2 under the llamacpp protocol, 0
/// under windows. The CPU paths compute the logits of rows first_scored … ctx−1 only.
int first_scored(const PerplexityOptions& o) { return o.protocol == PplProtocol::LlamaCpp ? o.ctx / 2 : 0; }

/// NLL sums over the scored predictions of chunk `chunk` from its logits [ctx − row0, vocab] (rows
/// row0 … ctx−1; row0 ≤ first_scored(o)); only `nonfinite` set when a logit is NaN or ±Inf.
ChunkSums score_logits(const std::vector<int32_t>& tokens, int64_t chunk, const PerplexityOptions& o, int vocab,
                       const float* logits, int row0) {
  const int ctx = o.ctx;
  const int64_t start = chunk * ctx;
  const int first = first_scored(o);
  ChunkSums s;
  if (first_nonfinite_f32(logits, int64_t(ctx - row0) * vocab) >= 0) {
    s.nonfinite = true;
    return s;
  }
  for (int pos = first; pos < ctx - 1; ++pos) {
    const float* row = logits + static_cast<size_t>(pos - row0) * vocab;
    const int32_t target = tokens[static_cast<size_t>(start + pos + 1)];
    const double nll = ops::log_sum_exp(row, vocab) - row[target];
    s.nll += nll;
    s.nll2 += nll * nll;
    ++s.count;
  }
  return s;
}

/// "at chunk 2 (tokens 512-767)".
std::string chunk_where(int64_t chunk, const PerplexityOptions& o);

/// Runs chunk `input` on the reference into ref.logits [ctx − first_scored, vocab].
void run_reference(const PerplexityOptions& o, const std::vector<int32_t>& input, ReferenceRun& ref) {
  ref.cache.clear();
  const int first = first_scored(o);
  ref.logits.resize(static_cast<size_t>(o.ctx - first) * static_cast<size_t>(ref.model.config().vocab_size));
  ref.model.forward_tail(input.data(), o.ctx, first, ref.cache, ref.ws, ref.logits.data());
}

/// Compares the reference's logits (run_reference, already run when `ran`) with the test's `logits`
/// [ctx − row0, vocab] (rows row0 … ctx−1) on the chunk's scored predictions (positions in
/// parallel, results in order) into s.cmp.
void compare_chunk(const std::vector<int32_t>& tokens, int64_t chunk, const PerplexityOptions& o, int vocab,
                   const float* logits, int row0, const std::vector<int32_t>& input, ReferenceRun& ref, ChunkSums& s,
                   bool ran = false) {
  if (!ran) run_reference(o, input, ref);
  const int first = first_scored(o);
  if (first_nonfinite_f32(ref.logits.data(), int64_t(o.ctx - first) * vocab) >= 0) {
    KVCache cache(ref.model.config(), o.ctx);
    Workspace ws;
    throw nonfinite_activation_error(locate_nonfinite_activation(ref.model, input.data(), o.ctx, cache, ws),
                                     "in the reference model " + chunk_where(chunk, o));
  }
  const int64_t start = chunk * o.ctx;
  s.cmp.assign(static_cast<size_t>(o.ctx - 1 - first), TokenComparison{});
#pragma omp parallel for schedule(static)
  for (int pos = first; pos < o.ctx - 1; ++pos) {
    const size_t ref_off = static_cast<size_t>(pos - first) * vocab, off = static_cast<size_t>(pos - row0) * vocab;
    s.cmp[static_cast<size_t>(pos - first)] =
        compare_token_logits(ref.logits.data() + ref_off, logits + off, vocab, tokens[static_cast<size_t>(start + pos + 1)]);
  }
}

/// Runs one chunk on the CPU model and scores it.
ChunkSums score_chunk(const Decoder& model, const std::vector<int32_t>& tokens, int64_t chunk,
                      const PerplexityOptions& o, KVCache& cache, Workspace& ws, std::vector<float>& logits,
                      std::vector<int32_t>& input, ReferenceRun* ref = nullptr) {
  const int vocab = model.config().vocab_size;
  chunk_input(tokens, chunk, o, model.config().bos_id, input);
  cache.clear();
  const int first = first_scored(o);  // the LM head runs on the scored rows' tail only
  logits.resize(static_cast<size_t>(o.ctx - first) * vocab);
  // A small model with a reference: both forwards at once, each on one thread (ops inside run
  // single-threaded, as in the chunk-parallel path); otherwise one after the other, ops parallel.
  const bool pair = ref && model.config().dim < 1024 && threads::max_threads() > 1 && !omp_in_parallel();
  if (pair) {
#pragma omp parallel sections num_threads(2)
    {
#pragma omp section
      model.forward_tail(input.data(), o.ctx, first, cache, ws, logits.data());
#pragma omp section
      run_reference(o, input, *ref);
    }
  } else {
    model.forward_tail(input.data(), o.ctx, first, cache, ws, logits.data());
  }
  ChunkSums s = score_logits(tokens, chunk, o, vocab, logits.data(), first);
  s.kv = cache.bytes();
  if (ref && !s.nonfinite) compare_chunk(tokens, chunk, o, vocab, logits.data(), first, input, *ref, s, pair);
  return s;
}

/// Throws UsageError when options.reference does not share `config`'s vocabulary size.
void check_reference(const ModelConfig& config, const PerplexityOptions& o) {
  if (o.reference && o.reference->config().vocab_size != config.vocab_size)
    throw UsageError("the reference model has a vocabulary of " + std::to_string(o.reference->config().vocab_size) +
                     " tokens, the model under test " + std::to_string(config.vocab_size) + ": they must be equal");
}

/// Combines per-chunk sums (in chunk order) into the result.
PerplexityResult combine(const std::vector<ChunkSums>& sums, const PerplexityOptions& o, double seconds) {
  const int64_t chunks = static_cast<int64_t>(sums.size());
  PerplexityResult r;
  double nll = 0, nll2 = 0;
  for (const ChunkSums& s : sums) {
    nll += s.nll;
    nll2 += s.nll2;
    r.tokens_scored += s.count;
    r.chunk_nll.push_back(s.nll / static_cast<double>(s.count));
  }
  const double N = static_cast<double>(r.tokens_scored);
  r.nll_mean = nll / N;
  r.ppl = std::exp(r.nll_mean);
  // Standard error as llama.cpp reports it: ppl · sqrt(var(nll) / (N − 1)), var = E[nll²] − E[nll]².
  const double var = nll2 / N - r.nll_mean * r.nll_mean;
  r.ppl_stderr = (var > 0 && N > 1) ? r.ppl * std::sqrt(var / (N - 1)) : 0.0;
  r.chunks = chunks;
  r.tokens_processed = chunks * o.ctx;
  r.seconds = seconds;
  r.tokens_per_second = seconds > 0 ? static_cast<double>(r.tokens_processed) / seconds : 0.0;
  double dense = 0, sinks = 0, outl = 0, tables = 0;
  for (const ChunkSums& s : sums) {
    dense += static_cast<double>(s.kv.dense);
    sinks += static_cast<double>(s.kv.sinks);
    outl += static_cast<double>(s.kv.outliers);
    tables += static_cast<double>(s.kv.tables);
  }
  const double per = 1.0 / (static_cast<double>(chunks) * o.ctx);
  r.kv_dense_bytes_per_token = dense * per;
  r.kv_sink_bytes_per_token = sinks * per;
  r.kv_outlier_bytes_per_token = outl * per;
  r.kv_table_bytes_per_token = tables * per;
  r.kv_bytes_per_token = (dense + sinks + outl + tables) * per;
  if (o.reference) {
    std::vector<TokenComparison> all;
    all.reserve(static_cast<size_t>(r.tokens_scored));
    std::vector<size_t> groups;
    for (const ChunkSums& s : sums) {
      all.insert(all.end(), s.cmp.begin(), s.cmp.end());
      groups.push_back(s.cmp.size());
    }
    r.comparison = summarize_comparison(all, groups);
  }
  return r;
}

/// "at chunk 2 (tokens 512-767)".
std::string chunk_where(int64_t chunk, const PerplexityOptions& o) {
  return "at chunk " + std::to_string(chunk) + " (tokens " + std::to_string(chunk * o.ctx) + "-" +
         std::to_string((chunk + 1) * o.ctx - 1) + ")";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

PerplexityResult evaluate_perplexity(const Decoder& model, const std::vector<int32_t>& tokens,
                                     const PerplexityOptions& o) {
  const int64_t chunks = checked_chunks(tokens, o);
  check_reference(model.config(), o);
  std::vector<ChunkSums> sums(static_cast<size_t>(chunks));
  const auto t0 = std::chrono::steady_clock::now();
  // Small models: one chunk per thread (ops inside run single-threaded). Large models: chunks in
  // order, each op parallel. The cut-off is where per-op parallelism becomes efficient.
  // With a reference model chunks run in order (one chunk's logits of each model at a time).
  const bool chunk_parallel =
      !o.reference && model.config().dim < 1024 && threads::max_threads() > 1 && chunks > 1;
  int64_t done = 0;
  // The first chunk (in text order) whose logits are not finite; later chunks are skipped.
  std::atomic<int64_t> first_bad{INT64_MAX};
  auto note = [&](int64_t i) {
    if (!sums[static_cast<size_t>(i)].nonfinite) return false;
    int64_t cur = first_bad.load();
    while (i < cur && !first_bad.compare_exchange_weak(cur, i)) {
    }
    return true;
  };
  if (chunk_parallel) {
#pragma omp parallel
    {
      KVCache cache(model.config(), o.ctx, o.kv, o.kv_params);
      Workspace ws;
      std::vector<float> logits;
      std::vector<int32_t> input;
#pragma omp for schedule(dynamic)
      for (int64_t i = 0; i < chunks; ++i) {
        if (i > first_bad.load(std::memory_order_relaxed)) continue;
        sums[static_cast<size_t>(i)] = score_chunk(model, tokens, i, o, cache, ws, logits, input);
        note(i);
        int64_t now_done;
#pragma omp atomic capture
        now_done = ++done;
        if (omp_get_thread_num() == 0 && o.on_progress) o.on_progress(now_done, chunks, now_done * o.ctx);
      }
    }
  } else {
    KVCache cache(model.config(), o.ctx, o.kv, o.kv_params);
    Workspace ws;
    std::vector<float> logits;
    std::vector<int32_t> input;
    std::unique_ptr<ReferenceRun> ref = o.reference ? std::make_unique<ReferenceRun>(*o.reference, o.ctx) : nullptr;
    for (int64_t i = 0; i < chunks; ++i) {
      sums[static_cast<size_t>(i)] = score_chunk(model, tokens, i, o, cache, ws, logits, input, ref.get());
      if (note(i)) break;
      if (o.on_progress) o.on_progress(i + 1, chunks, (i + 1) * o.ctx);
    }
  }
  if (first_bad.load() != INT64_MAX) {
    const int64_t bad = first_bad.load();
    std::vector<int32_t> input;
    chunk_input(tokens, bad, o, model.config().bos_id, input);
    throw nonfinite_activation_error(locate_nonfinite_chunk(model, input.data(), o), chunk_where(bad, o));
  }
  const double seconds = seconds_since(t0);
  if (o.on_progress) o.on_progress(chunks, chunks, chunks * o.ctx);
  return combine(sums, o, seconds);
}

PerplexityResult evaluate_perplexity_with(const ModelConfig& config, const std::vector<int32_t>& tokens,
                                          const PerplexityOptions& o, const PerplexityChunkRunner& run_chunk) {
  const int64_t chunks = checked_chunks(tokens, o);
  check_reference(config, o);
  std::unique_ptr<ReferenceRun> ref = o.reference ? std::make_unique<ReferenceRun>(*o.reference, o.ctx) : nullptr;
  std::vector<ChunkSums> sums(static_cast<size_t>(chunks));
  std::vector<float> logits(static_cast<size_t>(o.ctx) * static_cast<size_t>(config.vocab_size));
  std::vector<int32_t> input;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < chunks; ++i) {
    chunk_input(tokens, i, o, config.bos_id, input);
    const KVCacheBytes kv = run_chunk(input.data(), o.ctx, logits.data());
    ChunkSums& s = sums[static_cast<size_t>(i)];
    s = score_logits(tokens, i, o, config.vocab_size, logits.data(), 0);
    if (s.nonfinite)
      throw nonfinite_activation_error(o.locate_nonfinite ? o.locate_nonfinite(input.data(), o.ctx) : std::string(),
                                       chunk_where(i, o));
    s.kv = kv;
    if (ref) compare_chunk(tokens, i, o, config.vocab_size, logits.data(), 0, input, *ref, s);
    if (o.on_progress) o.on_progress(i + 1, chunks, (i + 1) * o.ctx);
  }
  return combine(sums, o, seconds_since(t0));
}

PerplexityResult evaluate_perplexity_layer_major(const EvalModel& model, const EvalModel* reference,
                                                 const std::vector<int32_t>& tokens, const PerplexityOptions& o,
                                                 int64_t group_bytes) {
  auto decoder = [](const EvalModel& m) -> const Decoder& {
    if (!m.resident == !m.streamed) throw std::invalid_argument("EvalModel: give exactly one of resident and streamed");
    return m.resident ? *m.resident : *m.streamed->model().model;
  };
  const Decoder& test = decoder(model);
  const ModelConfig& c = test.config();
  const int64_t chunks = checked_chunks(tokens, o);
  if (reference && decoder(*reference).config().vocab_size != c.vocab_size)
    throw UsageError("the reference model has a vocabulary of " + std::to_string(decoder(*reference).config().vocab_size) +
                     " tokens, the model under test " + std::to_string(c.vocab_size) + ": they must be equal");
  if (model.streamed && o.kv.quantized())
    throw UsageError("a model evaluated layer by layer runs with an FP32 KV cache; leave out the KV-cache format (--kv)");
  if (model.streamed) model.streamed->hold_lm_head();
  if (reference && reference->streamed) reference->streamed->hold_lm_head();

  const int vocab = c.vocab_size, first = first_scored(o);
  int64_t widest = 0;
  for (const EvalModel* m : {&model, reference})
    if (m && m->streamed) widest = std::max<int64_t>(widest, m->streamed->config().dim);
  const int64_t per_chunk = 4 * int64_t(o.ctx) * std::max<int64_t>(widest, 1);
  const int64_t group = std::clamp<int64_t>(group_bytes / per_chunk, 1, chunks);
  const int streamed_sides = (model.streamed ? 1 : 0) + (reference && reference->streamed ? 1 : 0);

  std::vector<ChunkSums> sums(static_cast<size_t>(chunks));
  KVCache cache(c, o.ctx, o.kv, o.kv_params);
  Workspace ws;
  std::vector<float> logits(static_cast<size_t>(o.ctx - first) * vocab);
  std::vector<int32_t> input;
  std::unique_ptr<ReferenceRun> ref = reference ? std::make_unique<ReferenceRun>(decoder(*reference), o.ctx) : nullptr;
  std::unique_ptr<LayerMajorLogits> test_lm = model.streamed ? std::make_unique<LayerMajorLogits>(*model.streamed) : nullptr;
  std::unique_ptr<LayerMajorLogits> ref_lm =
      reference && reference->streamed ? std::make_unique<LayerMajorLogits>(*reference->streamed) : nullptr;
  const int64_t kvw = int64_t(c.n_kv_heads) * c.head_dim;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t g0 = 0; g0 < chunks; g0 += group) {
    const int64_t g1 = std::min(chunks, g0 + group);
    std::vector<std::vector<int32_t>> inputs;
    for (int64_t i = g0; i < g1; ++i) {
      chunk_input(tokens, i, o, c.bos_id, input);
      inputs.push_back(input);
    }
    auto where = [&](size_t k) { return chunk_where(g0 + int64_t(k), o); };
    int side = 0;
    for (LayerMajorLogits* lm : {test_lm.get(), ref_lm.get()}) {
      if (!lm) continue;
      lm->run(inputs, first, where, [&](int done, int layers) {
        if (!o.on_progress) return;
        const double frac = (side + double(done) / layers) / streamed_sides;
        const int64_t at = g0 + int64_t(double(g1 - g0) * frac);
        o.on_progress(at, chunks, at * o.ctx);
      });
      ++side;
    }
    for (int64_t i = g0; i < g1; ++i) {
      chunk_input(tokens, i, o, c.bos_id, input);
      ChunkSums& s = sums[static_cast<size_t>(i)];
      if (test_lm) {
        test_lm->logits(size_t(i - g0), logits.data());
        s = score_logits(tokens, i, o, vocab, logits.data(), first);
        if (s.nonfinite) throw nonfinite_activation_error("the final norm or the LM head", chunk_where(i, o));
        s.kv.dense = 2 * int64_t(c.n_layers) * kvw * 4 * o.ctx;  // the FP32 cache of forward_layer
      } else {
        s = score_chunk(test, tokens, i, o, cache, ws, logits, input);
        if (s.nonfinite) throw nonfinite_activation_error(locate_nonfinite_chunk(test, input.data(), o), chunk_where(i, o));
      }
      if (ref) {
        bool ran = false;
        if (ref_lm) {
          ref->logits.resize(static_cast<size_t>(o.ctx - first) * vocab);
          ref_lm->logits(size_t(i - g0), ref->logits.data());
          if (first_nonfinite_f32(ref->logits.data(), int64_t(ref->logits.size())) >= 0)
            throw nonfinite_activation_error("the final norm or the LM head", "in the reference model " + chunk_where(i, o));
          ran = true;
        }
        compare_chunk(tokens, i, o, vocab, logits.data(), first, input, *ref, s, ran);
      }
      if (o.on_progress && !streamed_sides) o.on_progress(i + 1, chunks, (i + 1) * o.ctx);
    }
  }
  const double seconds = seconds_since(t0);
  if (o.on_progress) o.on_progress(chunks, chunks, chunks * o.ctx);
  PerplexityOptions with_ref = o;  // combine() summarizes the comparison when a reference is set
  with_ref.reference = reference ? &decoder(*reference) : nullptr;
  return combine(sums, with_ref, seconds);
}

std::string locate_nonfinite_chunk(const Decoder& model, const int32_t* input, const PerplexityOptions& o) {
  KVCache cache(model.config(), o.ctx, o.kv, o.kv_params);
  Workspace ws;
  return locate_nonfinite_activation(model, input, o.ctx, cache, ws);
}

}  // namespace sq
