// FP32 LLaMA runner on a CUDA device: the decoder of LlamaModel (model/llama_model.h) with its
// weights uploaded once and every op from cuda/cuda_ops.h, over a device KV cache in any KVSpec
// format (cuda/cuda_kv_cache.h).
//
// Scope (issue #7, first step): FP32 projections (DenseLinear) only; W8A8 / W4A16 linears are not
// supported yet (the constructor throws UnsupportedError naming the layer). Device-neutral C++: in a
// build without CUDA it compiles, and constructing it throws UnsupportedError (cuda/cuda_stub.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "core/model_config.h"
#include "cuda/cuda_kv_cache.h"
#include "cuda/cuda_runtime.h"
#include "model/llama_model.h"

namespace sq {

/// A LLaMA-family model whose forward pass runs on CUDA device 0. Not thread-safe (one scratch
/// set per instance); use one instance per host thread.
class CudaLlamaModel {
 public:
  /// Uploads `model`'s weights (the embedding is uploaded as FP32, dequantized if stored INT8).
  /// Throws UnsupportedError when a projection or the LM head is not an FP32 DenseLinear (naming
  /// the layer and its format), when sqkit was built without CUDA or no device is usable; CudaError
  /// when the device runs out of memory.
  explicit CudaLlamaModel(const LlamaModel& model);

  const ModelConfig& config() const { return config_; }

  /// As LlamaModel::forward: runs `n` host tokens at positions cache.length() … +n−1, appends
  /// their keys/values to `cache` and writes host `logits`: [n, vocab] for AllTokens, [1, vocab]
  /// for LastToken, nothing for None. Throws std::out_of_range for a token id outside the
  /// vocabulary and std::length_error when the cache has no room, both before touching the device.
  void forward(const int32_t* tokens, int64_t n, CudaKVCache& cache, float* logits, LogitsFor which);

 private:
  struct Linear {
    DeviceArray<float> w, b;  ///< w [out, in]; b [out] or empty
    int64_t in = 0, out = 0;
  };
  struct Layer {
    DeviceArray<float> attn_norm, ffn_norm;
    Linear q, k, v, o, gate, up, down;
  };
  static Linear upload(const sq::Linear& lin, const std::string& name);
  void linear(const Linear& L, const float* x, int64_t n, float* y);
  void reserve(int64_t n);

  ModelConfig config_;
  DeviceArray<float> embed_, final_norm_;
  std::vector<Layer> layers_;
  Linear lm_head_;
  // Scratch (device), grown by reserve(): activations of one forward block.
  int64_t reserved_ = 0;
  DeviceArray<float> x_, xn_, q_, k_, v_, att_, proj_, gate_, up_, logits_;
  DeviceArray<int32_t> tokens_, positions_;
};

}  // namespace sq
