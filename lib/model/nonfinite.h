// Non-finite activations: the drivers (perplexity, streaming, generation, calibration) check one
// cheap vector per block — the logits, or the final hidden state when there are none — and only
// when it holds a NaN or ±Inf re-run that block layer by layer to name where it first appeared.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"
#include "model/decoder.h"
#include "runtime/kv_cache.h"

namespace sq {

/// Where a non-finite value first appears when `model` runs tokens[0, n) at cache positions
/// cache.length() … cache.length()+n−1: re-runs the block step by step (Decoder::embed,
/// forward_layer with an observer on every linear input and output, the residual stream after each
/// layer, the final norm, the LM head in row blocks) and returns the first non-finite point, e.g.
/// "layer 3 (attention output, the o_proj input)", "layer 0 (mlp.down_proj output)", "layer 2
/// (residual stream)", "the final norm", "the LM head (logits)", or "" when every value is finite.
/// Appends the block's keys/values to `cache` (as forward() does). Costs one forward pass plus a
/// pass over each activation: call it only after a cheap check failed.
/// Throws what Decoder::forward throws (token out of range, cache full).
std::string locate_nonfinite_activation(const Decoder& model, const int32_t* tokens, int64_t n, KVCache& cache,
                                        Workspace& ws);

/// locate_nonfinite_activation for the block that the last forward() call on `cache` appended
/// (the last `n` rows, with no eviction in between): drops those rows (KVCache::keep_rows) and
/// re-runs the block on the cache state it saw. (The re-run rows' text positions are n later,
/// which matters only for FP16 attention-sink rows.) Throws std::invalid_argument when the cache
/// holds fewer than `n` rows.
std::string locate_nonfinite_last_block(const Decoder& model, const int32_t* tokens, int64_t n, KVCache& cache,
                                        Workspace& ws);

/// The NonFiniteError of a non-finite activation, one line: with a `location`, "non-finite
/// activation in LOCATION WHERE (the weights are finite: the activations overflow FP32 on this
/// input)"; without one (a backend that cannot re-run layer by layer, or a CPU re-run of another
/// backend's block that stays finite), "non-finite logits WHERE (the weights are finite; the layer
/// could not be located on this backend)". `where` is e.g. "at chunk 2 (tokens 512-767)".
NonFiniteError nonfinite_activation_error(const std::string& location, const std::string& where);

}  // namespace sq
