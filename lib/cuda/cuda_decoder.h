// The decoder on a CUDA device, for every architecture (issue 41): the layers run through the same
// run_decoder_layer as the CPU Decoder (model/decoder_layer_flow.h), configured by the model's
// DecoderSpec, with the ops of cuda/cuda_ops.h, over a device KV cache in any KVSpec format
// (cuda/cuda_kv_cache.h). Nothing here is specific to an architecture: norms with or without bias
// (RMSNorm/LayerNorm), QK-norm, RoPE (partial, per-layer θ) / ALiBi / learned positions, sliding
// windows, attention scale, parallel residual, post-norms, gated or plain MLPs with any activation
// and mixtures of experts are what DecoderSpec says.
//
// Where each step runs:
//   - token embedding on the host (Decoder::embed: the FP32 or INT8 table, embedding scale,
//     learned positions, embedding norm), then the [n, dim] rows are uploaded: the table stays in
//     host memory (llama.cpp also keeps token embeddings on the host), and a step uploads n·dim floats.
//   - every layer, the final norm and the LM head on the device;
//   - mixture-of-experts routing (softmax + top-k over n × n_experts router logits) on the host:
//     the router logits are downloaded, moe_routing_weights (the CPU's function) picks the experts,
//     and each expert's rows are gathered / scatter-added on the device (one synchronization per MoE
//     layer).
// Projections and the LM head are device linears (cuda/cuda_linear.h): FP32 (cuBLAS), W8A8
// (cuBLASLt INT8), W4A16 (packed INT4) or W8A16 (INT8 rows run as FP32); other formats (Atom W4A4)
// are refused by name. Device-neutral C++: in a build without CUDA it compiles, and constructing
// it throws UnsupportedError (cuda/cuda_stub.cpp).
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

/// One expert of a device mixture-of-experts FFN (model/decoder.h Expert).
struct CudaExpert {
  std::unique_ptr<cuda::DeviceLinear> gate_proj, up_proj, down_proj;
};

/// A decoder layer's weights on the device, with DecoderLayer's member names (the ones the model's
/// DecoderSpec uses are set; the others are empty / null).
struct CudaDecoderLayer {
  DeviceArray<float> attn_norm, attn_norm_bias, q_norm, k_norm, attn_post_norm, attn_post_norm_bias;
  DeviceArray<float> ffn_norm, ffn_norm_bias, ffn_post_norm, ffn_post_norm_bias;
  std::unique_ptr<cuda::DeviceLinear> q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, router;
  std::vector<CudaExpert> experts;
};

/// A decoder (any DecoderSpec) whose forward pass runs on CUDA device 0. Keeps a reference to the
/// host model (its embedding runs on the host): `model` must outlive it. Not thread-safe (one
/// scratch set per instance); use one instance per host thread.
class CudaDecoder {
 public:
  /// Uploads `model`'s layer weights, final norm and LM head (every linear in its own format through
  /// cuda::upload_linear). Throws UnsupportedError when a projection or the LM head has a format the
  /// CUDA backend does not run (naming the layer and its format, e.g. an Atom W4A4 linear; checked
  /// before the device, so on every machine), when sqkit was built without CUDA or no device is
  /// usable; std::logic_error for a layer-streamed model without its layers; CudaError when the
  /// device runs out of memory.
  explicit CudaDecoder(const Decoder& model);

  const ModelConfig& config() const { return config_; }

  /// As Decoder::forward: runs `n` host tokens at positions cache.length() … +n−1, appends their
  /// keys/values to `cache` and writes host `logits`: [n, vocab] for AllTokens, [1, vocab] for
  /// LastToken, nothing for None. Throws std::out_of_range for a token id outside the vocabulary
  /// and std::length_error when the cache has no room (or beyond learned positions), both before
  /// touching the device.
  void forward(const int32_t* tokens, int64_t n, CudaKVCache& cache, float* logits, LogitsFor which);

 private:
  friend struct CudaLayerBackend;
  void reserve(int64_t n);

  const Decoder* host_;
  ModelConfig config_;
  std::vector<std::vector<float>> rope_inv_freq_;  ///< [n_layers][rope_dim/2] host rope_inv_freq(config_, l)
  DeviceArray<float> alibi_slopes_;                 ///< [n_heads] (ALiBi models)
  DeviceArray<float> final_norm_, final_norm_bias_;
  std::vector<CudaDecoderLayer> layers_;
  std::unique_ptr<cuda::DeviceLinear> lm_head_;
  // Scratch (device), grown by reserve(): activations of one forward block.
  int64_t reserved_ = 0;
  DeviceArray<float> x_, xn_, q_, k_, v_, att_, proj_, proj2_, gate_, up_, router_, moe_x_, moe_out_, logits_, moe_w_;
  DeviceArray<int32_t> positions_, moe_rows_;
  std::vector<float> host_x_, host_router_;
};

}  // namespace sq
