#include "eval/streaming.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "core/error.h"
#include "core/finite.h"
#include "model/nonfinite.h"
#include "ops/ops.h"
#include "runtime/kv_cache.h"
#include "runtime/thread_governor.h"

namespace sq {

namespace {

struct StreamOut {
  std::vector<double> nll;           ///< [len − 1]: NLL of token t+1 given the stream up to t
  std::vector<TokenComparison> cmp;  ///< with a reference: [len − 1] comparisons, in order
  std::vector<int64_t> segment_bytes;
  int64_t peak_bytes = 0, peak_rows = 0;
  /// Set when a step's logits were not finite (decoding stopped there): where the first non-finite
  /// activation of that step appeared ("" when the re-run stayed finite) and the stream position.
  bool nonfinite = false;
  std::string nonfinite_location;
  int64_t nonfinite_pos = -1;
  bool nonfinite_in_reference = false;  ///< the reference model's logits were not finite
};

/// The reference model's dense FP32 decoding of one stream, one step or one block at a time.
struct ReferenceStream {
  ReferenceStream(const Decoder& m, int64_t len) : model(m), cache(m.config(), len) {}
  const Decoder& model;
  KVCache cache;
  Workspace ws;
  std::vector<float> logits;
  /// Decodes tokens toks[t0 … t0+n−1] in one forward pass (the cache holds toks[0, t0)) and compares
  /// each next-token distribution with the test's `test_logits` [n, vocab] for target toks[t + 1]
  /// into out.cmp[t] (n = 1: token-by-token decoding; n > 1: the same predictions up to FP32
  /// rounding); false (out.nonfinite and out.nonfinite_in_reference set) when the reference's
  /// logits are not finite. Never throws (it runs inside OpenMP regions).
  bool block(const int32_t* toks, int64_t t0, int64_t n, const float* test_logits, StreamOut& out) {
    const int64_t vocab = model.config().vocab_size;
    logits.resize(static_cast<size_t>(n * vocab));
    model.forward(toks + t0, n, cache, ws, logits.data(), LogitsFor::AllTokens);
    for (int64_t i = 0; i < n; ++i) {
      const float* row = logits.data() + i * vocab;
      if (first_nonfinite_f32(row, vocab) >= 0) {
        out.nonfinite = out.nonfinite_in_reference = true;
        out.nonfinite_pos = t0 + i;
        return false;
      }
      out.cmp[size_t(t0 + i)] = compare_token_logits(row, test_logits + i * vocab, static_cast<int>(vocab), toks[t0 + i + 1]);
    }
    return true;
  }
  bool step(const int32_t* toks, int64_t t, const float* test_logits, StreamOut& out) { return block(toks, t, 1, test_logits, out); }
};

/// Token-by-token decoding of tokens[0, len) under a cache policy.
StreamOut decode_stream(const Decoder& model, const int32_t* toks, int64_t len, const KVPolicy& policy,
                        const StreamingOptions& o, const std::function<void()>& tick) {
  const int vocab = model.config().vocab_size;
  StreamOut out;
  out.nll.resize(static_cast<size_t>(len - 1));
  std::unique_ptr<ReferenceStream> ref = o.reference ? std::make_unique<ReferenceStream>(*o.reference, len) : nullptr;
  if (ref) out.cmp.resize(static_cast<size_t>(len - 1));
  KVCache cache(model.config(), policy.capacity(len), o.kv, o.kv_params);
  cache.set_track_quantization_error(policy.kind == KVPolicyKind::QHitter);
  KVRowScores scores;
  Workspace ws;
  if (policy.needs_attention()) ws.attention_mass = &scores.attention;
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (int64_t t = 0; t + 1 < len; ++t) {
    evict_for_next_token(policy, cache, scores);
    model.forward(toks + t, 1, cache, ws, logits.data(), LogitsFor::LastToken);
    if (first_nonfinite_f32(logits.data(), vocab) >= 0) {  // vocab floats next to a whole decode step
      out.nonfinite = true;
      out.nonfinite_pos = t;
      out.nonfinite_location = locate_nonfinite_last_block(model, toks + t, 1, cache, ws);
      return out;
    }
    out.nll[size_t(t)] = ops::log_sum_exp(logits.data(), vocab) - logits[size_t(toks[t + 1])];
    if (ref && !ref->step(toks, t, logits.data(), out)) return out;
    const int64_t bytes = cache.bytes().total();
    out.peak_bytes = std::max(out.peak_bytes, bytes);
    out.peak_rows = std::max(out.peak_rows, cache.length());
    if ((t + 1) % o.segment == 0 || t + 2 == len) out.segment_bytes.push_back(bytes);
    if (tick) tick();
  }
  return out;
}

/// decode_stream in blocks of up to o.batch tokens (StreamingOptions::batch; dense, window and sink
/// policies). Before each block the cache is cut to what the token-by-token cache holds before the
/// block's first token (the S sinks and the latest C − S − 1 rows), and attention follows
/// BlockEviction; after it, to what that cache holds after the block's last token, where the
/// segment's KV bytes are read (blocks end at segment boundaries).
StreamOut block_stream(const Decoder& model, const int32_t* toks, int64_t len, const KVPolicy& policy,
                       const StreamingOptions& o, const std::function<void()>& tick) {
  const int64_t vocab = model.config().vocab_size, B = o.batch;
  const bool dense = policy.kind == KVPolicyKind::Dense;
  const int64_t cap = policy.capacity(len), sinks = policy.kind == KVPolicyKind::Sink ? policy.sinks : 0;
  StreamOut out;
  out.nll.resize(static_cast<size_t>(len - 1));
  std::unique_ptr<ReferenceStream> ref = o.reference ? std::make_unique<ReferenceStream>(*o.reference, len) : nullptr;
  if (ref) out.cmp.resize(static_cast<size_t>(len - 1));
  KVCache cache(model.config(), dense ? len : std::min(len, cap - 1 + B), o.kv, o.kv_params);
  Workspace ws;
  if (!dense) ws.eviction = {cap, sinks};
  std::vector<float> logits;
  // keep(rows): keeps the sinks and the latest rows − S rows when the cache holds more than `rows`.
  auto keep = [&](int64_t rows) {
    const int64_t have = cache.length();
    if (dense || have <= rows) return;
    std::vector<int64_t> kept;
    for (int64_t r = 0; r < sinks; ++r) kept.push_back(r);
    for (int64_t r = have - (rows - sinks); r < have; ++r) kept.push_back(r);
    cache.keep_rows(kept);
  };
  for (int64_t t0 = 0; t0 + 1 < len;) {
    const int64_t seg_end = (t0 / o.segment + 1) * o.segment;  // first position of the next segment
    const int64_t n = std::min({B, len - 1 - t0, seg_end - t0});
    keep(cap - 1);
    logits.resize(static_cast<size_t>(n * vocab));
    model.forward(toks + t0, n, cache, ws, logits.data(), LogitsFor::AllTokens);
    for (int64_t i = 0; i < n; ++i) {
      const float* row = logits.data() + i * vocab;
      if (first_nonfinite_f32(row, vocab) >= 0) {
        out.nonfinite = true;
        out.nonfinite_pos = t0 + i;
        out.nonfinite_location = locate_nonfinite_last_block(model, toks + t0, n, cache, ws);
        return out;
      }
      out.nll[size_t(t0 + i)] = ops::log_sum_exp(row, static_cast<int>(vocab)) - row[size_t(toks[t0 + i + 1])];
    }
    if (ref && !ref->block(toks, t0, n, logits.data(), out)) return out;
    keep(cap);
    const int64_t bytes = cache.bytes().total();
    out.peak_bytes = std::max(out.peak_bytes, bytes);
    out.peak_rows = std::max(out.peak_rows, cache.length());
    t0 += n;
    if (t0 % o.segment == 0 || t0 + 1 == len) out.segment_bytes.push_back(bytes);
    if (tick)
      for (int64_t i = 0; i < n; ++i) tick();
  }
  return out;
}

/// One prefill of recompute:W,stride:K: the predictions at positions [begin, end] (end − begin < K)
/// come from tokens [first, end], first = max(0, end − W + 1) ≤ begin, from an empty cache.
struct RecomputeBlock {
  int64_t first, begin, end;
};

/// Block i of a stream of `len` tokens (len − 1 predictions) under recompute:W,stride:K.
RecomputeBlock recompute_block(int64_t i, int64_t len, int64_t w, int64_t k) {
  const int64_t begin = i * k, end = std::min(begin + k, len - 1) - 1;
  return {std::max<int64_t>(0, end - w + 1), begin, end};
}

/// Runs block `b`: tokens [first, begin) go through without logits, then tokens [begin, end] with
/// logits [end − begin + 1, vocab] into `logits`. False when a logit is not finite.
bool run_recompute_block(const Decoder& model, const int32_t* toks, const RecomputeBlock& b, KVCache& cache, Workspace& ws,
                         std::vector<float>& logits) {
  const int64_t vocab = model.config().vocab_size, n = b.end - b.begin + 1;
  cache.clear();
  if (b.begin > b.first) model.forward(toks + b.first, b.begin - b.first, cache, ws, nullptr, LogitsFor::None);
  model.forward(toks + b.begin, n, cache, ws, logits.data(), LogitsFor::AllTokens);
  return first_nonfinite_f32(logits.data(), n * vocab) < 0;
}

/// Recompute:W[,stride:K] (kv_policy.h): the stream's len − 1 predictions in blocks of K, each block
/// from one fresh prefill of at most W tokens (K = 1: the logits at t come from tokens
/// [max(0, t−W+1), t]).
StreamOut recompute_stream(const Decoder& model, const int32_t* toks, int64_t len, const KVPolicy& policy,
                           const StreamingOptions& o, const std::function<void()>& tick) {
  const int vocab = model.config().vocab_size;
  const int64_t w = policy.window, k = policy.stride, n_blocks = (len - 1 + k - 1) / k;
  StreamOut out;
  out.nll.resize(static_cast<size_t>(len - 1));
  auto score = [&](const RecomputeBlock& b, const std::vector<float>& logits) {
    for (int64_t t = b.begin; t <= b.end; ++t) {
      const float* row = logits.data() + (t - b.begin) * vocab;
      out.nll[size_t(t)] = ops::log_sum_exp(row, vocab) - row[size_t(toks[t + 1])];
    }
  };
  auto locate = [&](const RecomputeBlock& b) {  // re-run the failing prefill layer by layer
    KVCache cache(model.config(), w, o.kv, o.kv_params);
    Workspace ws;
    out.nonfinite = true;
    out.nonfinite_pos = b.begin;
    out.nonfinite_location = locate_nonfinite_activation(model, toks + b.first, b.end - b.first + 1, cache, ws);
  };
  int64_t peak = 0;
  if (o.reference) {  // blocks in order, in lock-step with the reference's dense decoding
    ReferenceStream ref(*o.reference, len);
    out.cmp.resize(static_cast<size_t>(len - 1));
    KVCache cache(model.config(), w, o.kv, o.kv_params);
    Workspace ws;
    std::vector<float> logits(static_cast<size_t>(std::min(k, len - 1) * vocab));
    for (int64_t i = 0; i < n_blocks; ++i) {
      const RecomputeBlock b = recompute_block(i, len, w, k);
      if (!run_recompute_block(model, toks, b, cache, ws, logits)) {
        locate(b);
        return out;
      }
      score(b, logits);
      peak = std::max(peak, cache.bytes().total());
      for (int64_t t = b.begin; t <= b.end; ++t) {
        if (!ref.step(toks, t, logits.data() + (t - b.begin) * vocab, out)) return out;
        if (tick) tick();
      }
    }
  } else {
    std::vector<char> bad(static_cast<size_t>(n_blocks), 0);  // per block: logits not finite
#pragma omp parallel reduction(max : peak)
    {
      KVCache cache(model.config(), w, o.kv, o.kv_params);
      Workspace ws;
      std::vector<float> logits(static_cast<size_t>(std::min(k, len - 1) * vocab));
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < n_blocks; ++i) {
        const RecomputeBlock b = recompute_block(i, len, w, k);
        bad[size_t(i)] = !run_recompute_block(model, toks, b, cache, ws, logits);
        if (!bad[size_t(i)]) score(b, logits);
        peak = std::max(peak, cache.bytes().total());
        if (tick)
          for (int64_t t = b.begin; t <= b.end; ++t) tick();
      }
    }
    const auto it = std::find(bad.begin(), bad.end(), 1);
    if (it != bad.end()) {
      locate(recompute_block(it - bad.begin(), len, w, k));
      return out;
    }
  }
  out.peak_bytes = peak;
  out.peak_rows = std::min(w, len);
  for (int64_t t = 0; t + 1 < len; ++t)
    if ((t + 1) % o.segment == 0 || t + 2 == len) out.segment_bytes.push_back(peak);
  return out;
}

}  // namespace

StreamingResult evaluate_streaming(const Decoder& model, const std::vector<int32_t>& all, const StreamingOptions& o) {
  int64_t n = static_cast<int64_t>(all.size());
  if (o.max_tokens > 0) n = std::min(n, o.max_tokens);
  if (o.segment <= 0) throw UsageError("--segment must be positive, got " + std::to_string(o.segment));
  if (o.ctx < 0 || o.ctx == 1) throw UsageError("the stream length -c must be 0 (whole text) or at least 2");
  const int64_t len = o.ctx > 0 ? o.ctx : n;
  const int64_t streams = len > 0 ? n / len : 0;
  if (len < 2 || streams == 0)
    throw UsageError("the text has " + std::to_string(n) + " tokens, fewer than one stream of " + std::to_string(std::max<int64_t>(len, 2)));
  const KVPolicy policy = resolve_kv_policy(o.policy, len);
  if (o.batch < 1) throw UsageError("the streaming batch size -b must be at least 1, got " + std::to_string(o.batch));
  const bool blocks = o.batch > 1;
  if (blocks && policy.kind != KVPolicyKind::Dense && policy.kind != KVPolicyKind::Window && policy.kind != KVPolicyKind::Sink)
    throw UsageError("-b " + std::to_string(o.batch) + ": blocks of tokens follow the dense, window and sink policies only (--kv-policy " +
                     kv_policy_name(policy) + (policy.kind == KVPolicyKind::Recompute ? " has its own stride" : " evicts by attention") +
                     "); use -b 1");
  if (blocks && policy.kind != KVPolicyKind::Dense && o.kv.quantized() && o.kv.keys == KVKeyRope::PostRope &&
      model.config().spec.position == PositionKind::Rope)
    throw UsageError("-b " + std::to_string(o.batch) + ": a quantized cache that stores keys after RoPE rounds each key at the "
                     "position it is rotated at, which blocks cannot reproduce after eviction; use --kv-keys pre-rope or -b 1");
  if (blocks && model.config().spec.position == PositionKind::Learned && policy.kind != KVPolicyKind::Dense)
    throw UsageError("-b " + std::to_string(o.batch) + ": a model with learned absolute positions embeds every token at its cache row, "
                     "which blocks cannot reproduce after eviction; use -b 1");
  if (o.reference && o.reference->config().vocab_size != model.config().vocab_size)
    throw UsageError("the reference model has a vocabulary of " + std::to_string(o.reference->config().vocab_size) +
                     " tokens, the model under test " + std::to_string(model.config().vocab_size) + ": they must be equal");
  if (o.reference)  // the reference decodes densely: its cache holds the whole stream
    check_cache_fits_learned_positions(o.reference->config(), KVPolicy{}, len, len);
  // Learned positions are cache rows: the cache may not outgrow the position table (refused here,
  // before any decoding, rather than failing at the first position past it).
  check_cache_fits_learned_positions(model.config(), policy, policy.capacity(len), len);

  const int64_t total = streams * (len - 1);
  int64_t done = 0;
  std::vector<StreamOut> outs(static_cast<size_t>(streams));
  const auto t0 = std::chrono::steady_clock::now();
  std::function<void()> tick = [&] {  // safe from several threads; reports from thread 0
    int64_t now;
#pragma omp atomic capture
    now = ++done;
    if (o.on_progress && omp_get_thread_num() == 0 && (now % 64 == 0 || now == total)) o.on_progress(now, total);
  };
  const bool recompute = policy.kind == KVPolicyKind::Recompute;
  if (streams > 1 && !recompute && threads::max_threads() > 1) {
    int64_t shared_done = 0;
#pragma omp parallel for schedule(dynamic)
    for (int64_t s = 0; s < streams; ++s) {
      outs[size_t(s)] = blocks ? block_stream(model, all.data() + s * len, len, policy, o, nullptr)
                               : decode_stream(model, all.data() + s * len, len, policy, o, nullptr);
      int64_t now;
#pragma omp atomic capture
      now = shared_done += len - 1;
      if (omp_get_thread_num() == 0 && o.on_progress) o.on_progress(now, total);
    }
  } else {
    for (int64_t s = 0; s < streams; ++s) {
      outs[size_t(s)] = recompute ? recompute_stream(model, all.data() + s * len, len, policy, o, tick)
                        : blocks    ? block_stream(model, all.data() + s * len, len, policy, o, tick)
                                    : decode_stream(model, all.data() + s * len, len, policy, o, tick);
      if (outs[size_t(s)].nonfinite) break;
    }
  }
  for (int64_t s = 0; s < streams; ++s)  // the first stream (in text order) that failed
    if (outs[size_t(s)].nonfinite) {
      const int64_t t = outs[size_t(s)].nonfinite_pos;
      throw nonfinite_activation_error(outs[size_t(s)].nonfinite_location,
                                       std::string(outs[size_t(s)].nonfinite_in_reference ? "in the reference model " : "") +
                                           "at token " + std::to_string(t) + " of stream " + std::to_string(s) + " (text token " +
                                           std::to_string(s * len + t) + ")");
    }
  StreamingResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.streams = streams;
  r.stream_length = len;
  const int64_t n_seg = (len - 1 + o.segment - 1) / o.segment;
  std::vector<double> seg_nll(static_cast<size_t>(n_seg), 0.0);
  r.segment_tokens.assign(static_cast<size_t>(n_seg), 0);
  double nll = 0;
  for (const StreamOut& s : outs) {
    r.token_nll.insert(r.token_nll.end(), s.nll.begin(), s.nll.end());
    for (int64_t t = 0; t + 1 < len; ++t) {
      nll += s.nll[size_t(t)];
      seg_nll[size_t(t / o.segment)] += s.nll[size_t(t)];
      ++r.segment_tokens[size_t(t / o.segment)];
    }
    r.peak_kv_bytes = std::max(r.peak_kv_bytes, s.peak_bytes);
    r.peak_kv_rows = std::max(r.peak_kv_rows, s.peak_rows);
  }
  r.segment_kv_bytes = outs[0].segment_bytes;
  r.tokens_scored = total;
  r.nll_mean = nll / static_cast<double>(total);
  r.ppl = std::exp(r.nll_mean);
  for (int64_t i = 0; i < n_seg; ++i) r.segment_ppl.push_back(std::exp(seg_nll[size_t(i)] / double(r.segment_tokens[size_t(i)])));
  r.tokens_per_second = r.seconds > 0 ? static_cast<double>(total) / r.seconds : 0.0;
  if (o.reference) {
    std::vector<TokenComparison> all_cmp;
    all_cmp.reserve(static_cast<size_t>(total));
    for (const StreamOut& s : outs) all_cmp.insert(all_cmp.end(), s.cmp.begin(), s.cmp.end());
    r.comparison = summarize_comparison(all_cmp);
  }
  if (o.on_progress) o.on_progress(total, total);
  return r;
}

}  // namespace sq
