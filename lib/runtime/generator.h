// Autoregressive generation: prefill the prompt as one block, then decode one token at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/decoder.h"
#include "quant/kv_codec.h"
#include "runtime/kv_format.h"
#include "runtime/kv_policy.h"
#include "runtime/sampler.h"

namespace sq {

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  bool hit_context_limit = false;  ///< stopped because the model's context was full
  bool hit_end_token = false;      ///< stopped at EOS (or BOS, which llama2.c models emit between stories)
  int64_t peak_kv_bytes = 0;       ///< largest KVCache::bytes().total() during generation
  int64_t peak_kv_tokens = 0;      ///< largest number of cached tokens
  /// Rows the KV cache was sized for: min(context, prompt + max_new_tokens) for the dense policy
  /// (the cache never holds more), the policy's budget for an evicting one.
  int64_t kv_capacity_tokens = 0;
};

/// KV cache and stopping behaviour of `generate`.
struct GenerationOptions {
  /// Cache policy: dense (the default) stops at `context_limit`; window/sink/h2o/qhitter evict and
  /// generate for as long as asked with constant memory (percent budgets resolve against
  /// context_limit). Recompute is not a generation policy (UsageError).
  KVPolicy policy;
  KVSpec kv;                                               ///< KV format (default FP32)
  const std::vector<NuqLayerParams>* kv_params = nullptr;  ///< nuq parameters [n_layers]
  bool ignore_eos = false;  ///< keep generating after EOS/BOS (the token is fed back like any other)
};

/// Rows a dense generation cache needs: the prompt and the tokens fed back (at most
/// max_new_tokens − 1, at least one row for a step), never more than `context_limit`. Sizing the
/// cache for the whole context instead held 1.9 GB for Qwen2.5's 32,768 positions however short the
/// run (KVCache zero-fills each layer's rows when first written).
int64_t dense_generation_capacity(int64_t prompt_tokens, int64_t max_new_tokens, int64_t context_limit);

/// Generates up to `max_new_tokens` after `prompt` (token ids, normally starting with BOS), calling
/// `on_token(prev, token)` for each generated token as soon as it is sampled. Stops early at
/// EOS/BOS or when the context (`context_limit` positions, normally config.max_seq_len) is full.
/// Throws UsageError for an empty prompt or one longer than the context.
/// With an evicting policy the prompt must fit the policy's cache (UsageError otherwise).
/// Throws NonFiniteError "non-finite activation in layer 3 (...) in the prompt (prefill of 5
/// tokens) (...)" / "... at generated token 7 (...)" when the logits of the prefill or of a decode
/// step hold a NaN or ±Inf (checked every step, before sampling; tokens already passed to
/// `on_token` stay emitted).
GenerationStats generate(const Decoder& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                         int64_t context_limit, Sampler& sampler, const std::function<void(int32_t, int32_t)>& on_token,
                         const GenerationOptions& options = {});

/// A model plus its KV cache as `generate_with` drives them: the CPU runner (generate) and the
/// CUDA runner (cuda/cuda_eval.h) implement it.
class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  /// Runs `n` tokens at the next cache positions (the prompt as one block, then one token at a
  /// time), appends them to the cache and writes the last token's logits [vocab] FP32 (host).
  virtual void forward(const int32_t* tokens, int64_t n, float* logits) = 0;
  /// Called before each decode step: an evicting cache makes room for one more token here.
  virtual void before_decode_step() {}
  /// Called once after forward(tokens, n, …) wrote non-finite logits, before generation stops:
  /// where the first non-finite activation of that block appears (re-running it on the cache state
  /// it saw, e.g. "layer 3 (attention output, the o_proj input)"), or "" when the backend cannot
  /// tell (the default) or the re-run stays finite.
  virtual std::string locate_nonfinite(const int32_t* tokens, int64_t n) { return ""; }
  /// Cached rows now, and their bytes (KVCache::bytes().total()).
  virtual int64_t cache_rows() const = 0;
  virtual int64_t cache_bytes() const = 0;
};

/// Throws UsageError for an empty prompt or one longer than `context_limit` tokens (every backend
/// checks this before allocating its cache).
void check_generation_prompt(const std::vector<int32_t>& prompt, int64_t context_limit);

/// The generation loop of `generate` on any backend: prefill `prompt`, then sample / stop at
/// EOS or BOS (unless ignore_eos) / feed back, up to `max_new_tokens`; stops with
/// hit_context_limit when `bounded` and the cache holds `context_limit` rows. `prompt` must be
/// non-empty and fit (check_generation_prompt, called by the caller before it builds the backend).
/// Checks every block's logits and throws NonFiniteError as `generate` does (the location from
/// backend.locate_nonfinite).
GenerationStats generate_with(GenerationBackend& backend, int vocab, int32_t eos_id, int32_t bos_id,
                              const std::vector<int32_t>& prompt, int64_t max_new_tokens, int64_t context_limit,
                              bool bounded, bool ignore_eos, Sampler& sampler,
                              const std::function<void(int32_t, int32_t)>& on_token);

}  // namespace sq
