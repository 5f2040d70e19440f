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
// Tensors of the DecoderSpec features (core/model_config.h), present only when the spec asks:
//   model.layers.{i}.input_layernorm.bias / post_attention_layernorm.bias   [dim]  (norm_bias)
//   model.layers.{i}.self_attn.o_proj.bias          [dim]                      (o_bias)
//   model.layers.{i}.self_attn.{q,k}_norm.weight    [head_dim]                 (qk_norm)
//   model.layers.{i}.attn_post_norm.{weight,bias}   [dim]                      (post_attn_norm)
//   model.layers.{i}.mlp_post_norm.{weight,bias}    [dim]                      (post_ffn_norm)
//   model.layers.{i}.mlp.{gate,up,down}_proj.bias   [hidden_dim] / [dim]        (mlp_bias)
//   plain MLP (mlp_gated false): mlp.up_proj (fc1) and mlp.down_proj (fc2), no gate_proj
//   model.layers.{i}.mlp.router.weight              [n_experts, dim]           (n_experts > 0; no
//   model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight                  dense mlp.*_proj)
//   post_attention_layernorm is absent with a shared input norm (spec.shared_input_norm)
//   model.embed_norm.{weight,bias}                  [dim]                      (embed_norm)
//   model.embed_positions.weight                    [max_seq_len + offset, dim] (Learned positions)
//   model.norm.bias                                 [dim]                      (norm_bias)
// Architecture files (formats/architectures/) map each checkpoint's own names onto these: fused
// q/k/v or gate/up weights are split, Conv1D weights transposed, Gemma's (1 + w) norms folded.
// Linear weights are row-major (out_features, in_features), i.e. PyTorch nn.Linear layout.
// The q/k row order matches `config.rope_layout` (llama2.c files: Interleaved; HF and GGUF files:
// HalfSplit — the GGUF loader undoes llama.cpp's q/k row permutation, formats/gguf_checkpoint.h).
#pragma once

#include <map>
#include <string>
#include <vector>

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
  /// Decoder layer l's tensors (every `model.layers.{l}.*`, as views sharing this checkpoint's
  /// storage) with this checkpoint's config, source and format: one layer for layer-by-layer work.
  Checkpoint layer(int l) const;
};

/// A model's tensor inventory, canonical name -> shape (what model_fingerprint hashes besides the
/// config), for models never held whole in memory.
using TensorShapes = std::map<std::string, std::vector<int64_t>>;

/// Canonical tensor names (see the table above).
namespace names {
inline std::string layer(int i) { return "model.layers." + std::to_string(i) + "."; }
inline const char* kEmbed = "model.embed_tokens.weight";
inline const char* kFinalNorm = "model.norm.weight";
inline const char* kLmHead = "lm_head.weight";
inline const char* kFinalNormBias = "model.norm.bias";
inline const char* kEmbedNorm = "model.embed_norm.weight";
inline const char* kEmbedNormBias = "model.embed_norm.bias";
inline const char* kEmbedPositions = "model.embed_positions.weight";
}  // namespace names

}  // namespace sq
