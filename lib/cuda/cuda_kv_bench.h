// CUDA KV decode-attention benchmark (issue #7 acceptance: "decode attention over a nuq4 cache vs
// FP16 at 8K and 32K tokens, target ≥ 1.2×"). Device-neutral C++ over cuda/cuda_kv_kernels.h; the
// `sq-bench --suite cuda-kv-decode` suite.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace sq::bench {

/// For each context T in `contexts`: one decode step of one layer with LLaMA-7B attention shapes
/// (32 query heads, 32 KV heads, head_dim 128, interleaved RoPE θ = 10000), one query over T rows,
/// through the same split-K decode kernel (cuda::kv_decode_attention) for three row formats:
/// "nuq4" (KVQuant: 4-bit codes, pre-RoPE per-channel keys rotated on the fly, per-token FP16
/// value scale/offset, 1 FP16 sink row, no outliers), "fp16" (IEEE half rows, keys after RoPE: the
/// baseline) and "fp32". Row contents are random (the kernel's work does not depend on them).
/// Each format has as many layer copies as make ≥ 256 MB (five times the 50 MB L2 of an
/// H100/H200) and the timed calls cycle through them, so every call reads its rows from DRAM.
/// Timing: 3 warm-up calls, then `reps` calls each timed with CUDA events; the median is reported
/// with bytes read per call (dense K and V rows and sinks), GB/s and the ratios fp16/nuq4 and
/// fp32/nuq4, plus the acceptance line. Returns the results as JSON. Throws UsageError for a
/// context < 2 or reps < 20, UnsupportedError without CUDA or a device (require_cuda).
nlohmann::json run_cuda_kv_decode_bench(const std::vector<int64_t>& contexts, int reps = 50);

}  // namespace sq::bench
