// Perplexity under named protocols (definitions: docs/protocols.md).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "eval/kl_divergence.h"
#include "model/decoder.h"
#include "quant/kv_codec.h"
#include "runtime/kv_format.h"

namespace sq {

enum class PplProtocol {
  /// Non-overlapping windows (SmoothQuant/GPTQ/KVQuant/Atom tables): floor(n/ctx) windows of the
  /// token stream (BOS only at the very start), each run with a fresh cache; all ctx−1 next-token
  /// predictions of each window are scored; the remainder is dropped.
  Windows,
  /// llama.cpp `llama-perplexity`: chunk i = tokens [i·ctx, (i+1)·ctx) with its first token
  /// replaced by BOS; only predictions of tokens ctx/2+1 … ctx−1 are scored (ctx−1−ctx/2 per chunk).
  LlamaCpp,
};

/// "windows" / "llamacpp".
const char* protocol_name(PplProtocol p);
/// Parses "windows" / "llamacpp"; throws UsageError otherwise.
PplProtocol parse_protocol(const std::string& name);

struct PerplexityOptions {
  PplProtocol protocol = PplProtocol::Windows;
  int ctx = 256;        ///< window / chunk length in tokens
  int64_t max_chunks = 0;  ///< 0 = all chunks the text holds
  /// llamacpp protocol: replace each chunk's first token by BOS. llama.cpp does so only when the
  /// model's tokenizer adds BOS (`add_bos_token`); sq-eval sets it from Tokenizer::default_add_bos().
  bool replace_first_with_bos = true;
  KVSpec kv;               ///< KV-cache format every chunk's cache uses (default FP32)
  /// Offline nuq parameters [n_layers] (from the .sqm file); required for nuq formats, else ignored.
  const std::vector<NuqLayerParams>* kv_params = nullptr;
  /// Called from the evaluating thread after each chunk with (chunks done, total chunks, tokens processed).
  std::function<void(int64_t, int64_t, int64_t)> on_progress;
  /// evaluate_perplexity_with only: when a chunk's logits hold a NaN or ±Inf, called with the
  /// chunk's input [ctx] to name where the first non-finite activation appears (e.g. a CPU re-run,
  /// locate_nonfinite_chunk; "" when it stays finite). Unset: the error names the chunk only.
  /// evaluate_perplexity always locates on its own model.
  std::function<std::string(const int32_t* input, int ctx)> locate_nonfinite;
  /// When set, every chunk also runs on this reference model (on the CPU, from its own dense FP32
  /// KV cache: `kv` applies to the model under test only) with the same input, and the result's
  /// `comparison` holds KL(P_ref‖P_test) and the other statistics over the same scored predictions
  /// (docs/protocols.md). Chunks then run one at a time, so at most one chunk's logits of each model
  /// are held; for a small model (dim < 1024) the two forwards of a chunk run side by side on two
  /// threads, each single-threaded. Must have the model's vocabulary size (UsageError otherwise).
  const Decoder* reference = nullptr;
};

struct PerplexityResult {
  double ppl = 0;          ///< exp(mean NLL)
  double ppl_stderr = 0;   ///< as llama.cpp: ppl · sqrt((E[nll²] − E[nll]²) / (N − 1))
  double nll_mean = 0;     ///< mean negative log-likelihood per scored token (nats)
  int64_t tokens_scored = 0;
  int64_t tokens_processed = 0;  ///< tokens run through the model (chunks × ctx), as llama.cpp counts
  int64_t chunks = 0;
  double seconds = 0;            ///< wall time of the evaluation (not tokenization or loading)
  double tokens_per_second = 0;  ///< tokens_processed / seconds
  std::vector<double> chunk_nll; ///< mean NLL of each chunk, in order
  /// KV-cache bytes per token measured on the filled caches (all layers, K and V; mean over chunks
  /// of KVCache::bytes() / ctx), split like KVCacheBytes.
  double kv_bytes_per_token = 0, kv_dense_bytes_per_token = 0, kv_sink_bytes_per_token = 0,
         kv_outlier_bytes_per_token = 0, kv_table_bytes_per_token = 0;
  /// With PerplexityOptions::reference: the comparison with the reference on the scored predictions.
  std::optional<ReferenceComparison> comparison;
};

/// Checks that an evaluation produced a result worth reporting: throws InputError "SOURCE: no token
/// was scored ..." when `tokens_scored` is 0 (a text or -c too short for the protocol) and Error
/// "perplexity is not finite ..." when `ppl` is NaN or infinite. Tools call it before printing, so a
/// degenerate run never exits 0.
void check_scored_result(int64_t tokens_scored, double ppl, const std::string& source);

/// Number of chunks `tokens` holds for ctx (floor(n/ctx), capped by max_chunks when > 0).
int64_t perplexity_chunks(int64_t n_tokens, const PerplexityOptions& options);

/// Evaluates perplexity of `model` on the token stream `tokens` (already tokenized, with BOS at
/// the start for both protocols). Uses all OpenMP threads: whole chunks in parallel for small
/// models, parallel ops inside one chunk for large ones; the result does not depend on the thread
/// count (per-chunk sums are combined in chunk order).
/// Throws UsageError when ctx < 2 or the text holds no complete chunk. Every chunk's logits are
/// checked for NaN / ±Inf (one pass over [ctx, vocab] floats, next to the LM head's ctx·vocab·dim
/// multiply-adds); the first chunk that fails is re-run layer by layer and NonFiniteError
/// "non-finite activation in layer 3 (attention output, the o_proj input) at chunk 2 (tokens
/// 512-767) (...)" is thrown (model/nonfinite.h).
PerplexityResult evaluate_perplexity(const Decoder& model, const std::vector<int32_t>& tokens,
                                     const PerplexityOptions& options);

/// Runs one chunk on some backend with a fresh KV cache in options.kv's format: `input` [ctx] token
/// ids → `logits` [ctx, vocab] row-major FP32 (every position's next-token logits); returns the
/// cache's bytes after the chunk (KVCache::bytes()).
using PerplexityChunkRunner = std::function<KVCacheBytes(const int32_t* input, int ctx, float* logits)>;

/// evaluate_perplexity for any backend (the CUDA runner, cuda/cuda_eval.h): the same protocols,
/// scoring and result fields, with chunks run in order on the calling thread by `run_chunk`.
/// `config` supplies the vocabulary size and BOS id. Throws like evaluate_perplexity (the location of
/// a non-finite chunk comes from options.locate_nonfinite), plus whatever `run_chunk` throws.
PerplexityResult evaluate_perplexity_with(const ModelConfig& config, const std::vector<int32_t>& tokens,
                                          const PerplexityOptions& options, const PerplexityChunkRunner& run_chunk);

class LayerStream;

/// One side of a layer-major evaluation: a resident model, or a model read one layer at a time.
struct EvalModel {
  const Decoder* resident = nullptr;
  /// Read layer-major (eval/layer_major.h); its LM head is loaded for the logits (hold_lm_head).
  LayerStream* streamed = nullptr;
};

/// evaluate_perplexity (and, with `reference`, its comparison) where the model under test, the
/// reference, or both are layer streams (model/layer_stream.h) run layer-major: chunks are taken in
/// groups of at most `group_bytes` of hidden states (4 · ctx · dim per chunk; at least one chunk),
/// and each group runs through every layer of each streamed side, each layer read once per group,
/// before its chunks are scored in order; resident sides run chunk by chunk as in
/// evaluate_perplexity. Memory: per streamed side its global tensors and LM head, one layer, the
/// group's hidden states and one chunk's logits (sq-eval's path for models larger than memory).
/// Same protocols, scoring and result fields; options.reference is ignored. A streamed model under
/// test runs with an FP32 KV cache (kv_bytes_per_token reports it); UsageError when options.kv asks
/// for another format. `on_progress` is also called after each layer, with the group's chunks
/// counted in proportion to the layers done. Throws like evaluate_perplexity, NonFiniteError naming
/// the layer (LayerMajorLogits::run) for a streamed side, and what LayerStream::layer throws.
PerplexityResult evaluate_perplexity_layer_major(const EvalModel& model, const EvalModel* reference,
                                                 const std::vector<int32_t>& tokens, const PerplexityOptions& options,
                                                 int64_t group_bytes = int64_t(1) << 30);

/// Where the first non-finite activation appears when chunk `input` [options.ctx] runs on `model`
/// from a fresh KV cache in options.kv's format (locate_nonfinite_activation), "" when every value
/// is finite. For PerplexityOptions::locate_nonfinite when another backend ran the chunk.
std::string locate_nonfinite_chunk(const Decoder& model, const int32_t* input, const PerplexityOptions& options);

}  // namespace sq
