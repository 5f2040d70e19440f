// Perplexity and generation on the CUDA runner: the CPU's protocols and generation loop
// (eval/perplexity.h, runtime/generator.h) driving a CudaDecoder over a CudaKVCache.
// Device-neutral C++: in a build without CUDA these compile, and constructing the model throws.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "cuda/cuda_decoder.h"
#include "eval/perplexity.h"
#include "runtime/generator.h"

namespace sq {

/// evaluate_perplexity on the GPU: every chunk runs as one prefill block on `model` with a fresh
/// CudaKVCache of options.kv's format (nuq parameters from options.kv_params); scoring, protocols
/// and result fields are the CPU's (evaluate_perplexity_with), so CPU and CUDA results compare
/// directly. Chunks run in order. Throws UsageError like evaluate_perplexity, UnsupportedError for
/// a KV format the CUDA cache does not store, CudaError on device failures.
PerplexityResult evaluate_perplexity_cuda(CudaDecoder& model, const std::vector<int32_t>& tokens,
                                          const PerplexityOptions& options);

/// generate() on the GPU. Only the dense policy (UsageError for the evicting policies, which run on
/// the CPU only); the cache holds `context_limit` positions in options.kv's format. Throws like
/// generate().
GenerationStats generate_cuda(CudaDecoder& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                              int64_t context_limit, Sampler& sampler, const std::function<void(int32_t, int32_t)>& on_token,
                              const GenerationOptions& options = {});

}  // namespace sq
