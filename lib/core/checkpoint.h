// A loaded checkpoint: model config plus named FP32 tensors, whatever file format it came from.
//
// Tensor names follow the Hugging Face LLaMA convention (the canonical names of sqkit):
//   model.embed_tokens.weight                      [vocab, dim]
//   model.layers.{i}.input_layernorm.weight         [dim]
//   model.layers.{i}.self_attn.q_proj.weight        [n_heads*head_dim, dim]     (out, in)
//   model.layers.{i}.self_attn.k_proj.weight        [n_kv_heads*head_dim, dim]
//   model.layers.{i}.self_attn.v_proj.weight        [n_kv_heads*head_dim, dim]
//   model.layers.{i}.self_attn.{q,k,v}_proj.bias    (only when config.qkv_bias)
//   model.layers.{i}.self_attn.o_proj.weight        [dim, n_heads*head_dim]
//   model.layers.{i}.post_attention_layernorm.weight [dim]
//   model.layers.{i}.mlp.gate_proj.weight           [hidden_dim, dim]   (llama2.c w1)
//   model.layers.{i}.mlp.up_proj.weight             [hidden_dim, dim]   (llama2.c w3)
//   model.layers.{i}.mlp.down_proj.weight           [dim, hidden_dim]   (llama2.c w2)
//   model.norm.weight                               [dim]
//   lm_head.weight                                  [vocab, dim]  (absent when config.tied_embeddings)
// Linear weights are row-major (out_features, in_features), i.e. PyTorch nn.Linear layout.
// The q/k row order matches `config.rope_layout` (llama2.c files: Interleaved; HF and GGUF files:
// HalfSplit — the GGUF loader undoes llama.cpp's q/k row permutation, formats/gguf_checkpoint.h).
#pragma once

#include <map>
#include <string>

#include "core/model_config.h"
#include "core/tensor.h"

namespace sq {

struct Checkpoint {
  ModelConfig config;
  std::map<std::string, Tensor> tensors;  ///< canonical name -> FP32 tensor
  std::string source;   ///< path it was loaded from (file or directory)
  std::string format;   ///< "llama2c", "hf-safetensors", "gguf", "sqm"

  /// The tensor `name`; throws InputError naming `source`, the tensor and the expected shape when it
  /// is missing or its shape differs from `expected_shape`.
  const Tensor& get(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  bool has(const std::string& name) const { return tensors.count(name) != 0; }
};

/// Canonical tensor names (see the table above).
namespace names {
inline std::string layer(int i) { return "model.layers." + std::to_string(i) + "."; }
inline const char* kEmbed = "model.embed_tokens.weight";
inline const char* kFinalNorm = "model.norm.weight";
inline const char* kLmHead = "lm_head.weight";
}  // namespace names

}  // namespace sq
