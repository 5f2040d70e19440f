// Streaming evaluation (`sq-eval --protocol streaming`, docs/protocols.md): decode a token stream
// one token at a time (batch 1) under a KV-cache policy (runtime/kv_policy.h) and KV format, and
// score every next-token prediction. StreamingLLM (Xiao et al. 2024) §4.1 / thesis §4.2 setting.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "eval/kl_divergence.h"
#include "model/decoder.h"
#include "quant/kv_codec.h"
#include "runtime/kv_format.h"
#include "runtime/kv_policy.h"

namespace sq {

struct StreamingOptions {
  KVPolicy policy;          ///< percentages are resolved against the stream length
  /// Stream length in tokens: the text is cut into consecutive streams of `ctx` tokens, each decoded
  /// from an empty cache; 0 = one stream over the whole text (after max_tokens).
  int64_t ctx = 0;
  int64_t max_tokens = 0;   ///< use only the first N tokens of the text (0 = all)
  int64_t segment = 1000;   ///< tokens per reported segment (by position within a stream)
  /// Tokens per forward pass (`sq-eval -b`). 1: token-by-token decoding (the decode speed the papers
  /// measure). B > 1 (dense, window and sink policies; under eviction RoPE or ALiBi models with an
  /// FP32 cache or a quantized one that stores keys before RoPE):
  /// blocks of up to B tokens, each query seeing exactly the rows and positions it would see one
  /// token at a time (model/decoder.h, BlockEviction), so the predictions are the same up to FP32
  /// rounding at many times the speed; tokens_per_second is then not a decode speed. A block never
  /// crosses a segment boundary, so segment KV bytes are exact; the peak is taken at block ends.
  int64_t batch = 1;
  KVSpec kv;                ///< KV format (default FP32)
  const std::vector<NuqLayerParams>* kv_params = nullptr;  ///< nuq parameters [n_layers]
  /// Called after each scored token from the evaluating thread: (tokens scored, total to score).
  std::function<void(int64_t, int64_t)> on_progress;
  /// When set, every stream is also decoded token by token on this reference model, in lock-step,
  /// **dense with an FP32 cache** (`policy` and `kv` apply to the model under test only), and the
  /// result's `comparison` holds KL(P_ref‖P_test) and the other statistics over every scored
  /// prediction (docs/protocols.md). Only one step's logits of each model are held. Must have the
  /// model's vocabulary size (UsageError otherwise).
  const Decoder* reference = nullptr;
};

struct StreamingResult {
  double ppl = 0, nll_mean = 0;
  int64_t tokens_scored = 0;
  int64_t streams = 0, stream_length = 0;
  std::vector<double> token_nll;          ///< [streams·(L − 1)] NLL of every prediction (stream, then position)
  std::vector<double> segment_ppl;        ///< PPL of predictions at stream positions [i·segment, (i+1)·segment)
  std::vector<int64_t> segment_tokens;    ///< scored predictions per segment
  std::vector<int64_t> segment_kv_bytes;  ///< KV-cache bytes at the end of each segment (first stream)
  int64_t peak_kv_bytes = 0;              ///< largest KVCache::bytes().total() seen after any token
  int64_t peak_kv_rows = 0;               ///< largest number of cached tokens
  double seconds = 0, tokens_per_second = 0;  ///< decode wall time; tokens decoded / seconds
  /// With StreamingOptions::reference: the comparison with the reference on every scored prediction.
  std::optional<ReferenceComparison> comparison;
};

/// Decodes `tokens` under `options` and scores every prediction of the next token (in blocks of
/// options.batch tokens when that is above 1: see StreamingOptions::batch). Recompute:W
/// runs, for each position t, a fresh prefill of tokens [t−W+1, t] (positions 0…) and scores its
/// last prediction; streams and recompute positions run in parallel over OpenMP threads,
/// token-by-token streams sequentially. Throws UsageError when the text holds fewer than 2 tokens
/// or the policy does not fit the stream, or batch > 1 with a policy other than dense, window or sink,
/// with eviction on a model with learned positions or with a quantized cache keeping post-RoPE keys
/// (each key is rounded at the angle it was rotated at); NonFiniteError "non-finite activation in layer 3 (...) at
/// token 17 of stream 0 (text token 17) (...)" when a step's logits hold a NaN or ±Inf (each step's
/// [vocab] logits are checked; the failing step is re-run layer by layer, model/nonfinite.h).
StreamingResult evaluate_streaming(const Decoder& model, const std::vector<int32_t>& tokens,
                                   const StreamingOptions& options);

}  // namespace sq
