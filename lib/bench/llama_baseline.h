// The LLaMA forward pass as sqkit ran it before the generic decoder (issue 16; LlamaModel::
// run_layer at commit 45f851d), kept only as the baseline of sq-bench's `decoder` suite so the
// generic Decoder's speed on LLaMA is measured against it in one run. Not used by any tool.
#pragma once

#include <cstdint>

#include "model/decoder.h"

namespace sq::bench {

/// Runs `n` tokens through `model` (which must have the plain LLaMA structure:
/// ModelConfig::is_llama_structure) exactly as LlamaModel::forward did: RMSNorm, q/k/v, RoPE of q
/// and k at cache positions, KVCache write/read, Decoder::attention, o_proj, residual, RMSNorm,
/// SwiGLU FFN, residual; final RMSNorm and LM head for `which`. Same shapes and exceptions as
/// Decoder::forward; no observer, no fused nuq decode path (FP32 caches only).
void llama_baseline_forward(const Decoder& model, const int32_t* tokens, int64_t n, KVCache& cache, Workspace& ws, float* logits,
                            LogitsFor which);

}  // namespace sq::bench
