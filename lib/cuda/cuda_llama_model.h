// LLaMA runner on a CUDA device: the decoder of Decoder (model/decoder.h) with its
// weights uploaded once and every op from cuda/cuda_ops.h, over a device KV cache in any KVSpec
// format (cuda/cuda_kv_cache.h).
//
// Projections and the LM head are device linears (cuda/cuda_linear.h): FP32 (cuBLAS), W8A8
// (cuBLASLt INT8) or W4A16 (packed INT4 kernels); other formats (Atom W4A4) are refused by name.
// Device-neutral C++: in a
// build without CUDA it compiles, and constructing it throws UnsupportedError (cuda/cuda_stub.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/model_config.h"
#include "cuda/cuda_kv_cache.h"
#include "cuda/cuda_linear.h"
#include "cuda/cuda_runtime.h"
#include "model/decoder.h"

namespace sq {

/// A LLaMA-family model whose forward pass runs on CUDA device 0. Not thread-safe (one scratch
/// set per instance); use one instance per host thread.
class CudaLlamaModel {
 public:
  /// Uploads `model`'s weights (the embedding is uploaded as FP32, dequantized if stored INT8;
  /// every linear in its own format through cuda::upload_linear). Throws UnsupportedError when a
  /// projection or the LM head has a format the CUDA backend does not run (naming the layer and
  /// its format, e.g. an Atom W4A4 linear), when sqkit was built without CUDA or no device is
  /// usable; CudaError when the device runs out of memory.
  explicit CudaLlamaModel(const Decoder& model);

  const ModelConfig& config() const { return config_; }

  /// As Decoder::forward: runs `n` host tokens at positions cache.length() … +n−1, appends
  /// their keys/values to `cache` and writes host `logits`: [n, vocab] for AllTokens, [1, vocab]
  /// for LastToken, nothing for None. Throws std::out_of_range for a token id outside the
  /// vocabulary and std::length_error when the cache has no room, both before touching the device.
  void forward(const int32_t* tokens, int64_t n, CudaKVCache& cache, float* logits, LogitsFor which);

 private:
  struct Layer {
    DeviceArray<float> attn_norm, ffn_norm;
    std::unique_ptr<cuda::DeviceLinear> q, k, v, o, gate, up, down;
  };
  void reserve(int64_t n);

  ModelConfig config_;
  std::vector<float> rope_inv_freq_;  ///< [head_dim/2] host rope_inv_freq(config_): θ and RoPE scaling
  DeviceArray<float> embed_, final_norm_;
  std::vector<Layer> layers_;
  std::unique_ptr<cuda::DeviceLinear> lm_head_;
  // Scratch (device), grown by reserve(): activations of one forward block.
  int64_t reserved_ = 0;
  DeviceArray<float> x_, xn_, q_, k_, v_, att_, proj_, gate_, up_, logits_;
  DeviceArray<int32_t> tokens_, positions_;
};

}  // namespace sq
