// KV decode attention benchmark (issue #4): one decode step of one layer with LLaMA-7B attention
// shapes over an FP32 cache (KVCache::read's no-copy view + Decoder::attention, the runner's
// FP32 path) and over nuqX caches through the fused kernel (runtime/kv_decode_attention.h),
// measured side by side in one run.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace sq::bench {

/// For each context length T in `contexts`: 32 query heads, 32 KV heads, head_dim 128
/// (width 4096), interleaved RoPE θ = 10000, one query at position T − 1 over T cached rows.
/// Contenders: "fp32" (FP32 cache, keys stored after RoPE: KVCache::read returns pointers into
/// the cache, then sgemm attention), "nuq4"/"nuq3"/"nuq2" fused (pre-RoPE per-channel keys,
/// per-token values, 1 FP16 sink row, no outliers; random codebooks and rows), and at the first
/// context also "nuq4-generic" (KVCache::read dequantizes every row, then the same sgemm
/// attention: the runner's path before the fused kernel). A nuq cache holds as many layers as
/// make ≥ 64 MB (twice the 32 MB L3) and successive calls cycle through them, so every step reads
/// its rows from DRAM like the FP32 layer (≥ 134 MB) does. Interleaved best-of timing (≥ 3 rounds
/// and ≥ `min_seconds` per item) on all OpenMP threads. Prints ms per step, bytes the step reads
/// (K and V rows, sinks included) and GB/s, the ratio to FP32, the acceptance line (nuq4 fused
/// at T = 4096 no slower than FP32) and the load average; returns everything as JSON. Throws
/// UsageError for a context < 2.
nlohmann::json run_kv_decode_bench(const std::vector<int64_t>& contexts, double min_seconds);

}  // namespace sq::bench
