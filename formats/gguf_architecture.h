// GGUF architecture mappings: how one `general.architecture` of a GGUF file (llama.cpp naming,
// llama.cpp's src/llama-arch.cpp and the GGUF spec's "Standardized key-value pairs") maps onto
// sqkit's ModelConfig and canonical tensor names (core/checkpoint.h).
//
// Everything architecture-specific is data in a GgufArchitecture table; formats/gguf_checkpoint.cpp
// interprets the table. A new architecture is one more table entry: its metadata keys, its tensor
// names, its layer structure (DecoderSpec) and what llama.cpp hard-codes for it rather than storing
// in the file (sliding-window pattern, local RoPE base, embedding and attention scales).
// Supported: `llama`, `gemma3` (issue 16), `qwen2` (issue 18).
//
// The same table drives the GGUF export (formats/gguf_export.h) in the inverse direction: canonical
// names -> GGUF names, ModelConfig fields -> metadata keys, and the Q/K row permutation applied
// instead of undone, so reading and writing cannot disagree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model_config.h"

namespace sq {

/// A symbolic dimension of a tensor shape, resolved from the ModelConfig being built.
enum class GgufDim {
  Dim,      ///< ModelConfig::dim (embedding_length)
  QWidth,   ///< n_heads * head_dim
  KvWidth,  ///< n_kv_heads * head_dim
  Hidden,   ///< ModelConfig::hidden_dim (feed_forward_length)
  Vocab,    ///< ModelConfig::vocab_size
  HeadDim,  ///< ModelConfig::head_dim (per-head q/k norms)
};

/// Which head count a q/k projection's RoPE row order is permuted over (llama.cpp's converter
/// permutes q_proj rows per query head and k_proj rows per KV head); None for other tensors.
enum class GgufQkRows { None, Query, Key };

/// One tensor of the mapping.
struct GgufTensorRule {
  /// The GGUF name; for a per-layer rule the part after "blk.{i}." (e.g. "attn_q.weight").
  const char* gguf;
  /// The canonical name; for a per-layer rule the part after "model.layers.{i}." (e.g.
  /// "self_attn.q_proj.weight").
  const char* canonical;
  /// Row-major (PyTorch) shape, i.e. the GGUF dims reversed.
  std::vector<GgufDim> shape;
  /// Absent is allowed (only `output.weight`: absent means tied embeddings).
  bool optional = false;
  /// Rows to be restored from llama.cpp's interleaved RoPE order to the half-split order.
  GgufQkRows qk = GgufQkRows::None;
};

/// An integer metadata key "ARCH.SUFFIX" and the ModelConfig field it sets.
struct GgufIntKey {
  const char* suffix;                  ///< e.g. "block_count" (the key is "<arch>.block_count")
  int ModelConfig::*field;             ///< the field it sets
  bool required;                       ///< absent -> InputError naming the key
  int ModelConfig::*default_from = nullptr;  ///< optional key: absent -> copy this field (set earlier)
};

/// A floating-point metadata key "ARCH.SUFFIX" and the ModelConfig field it sets.
struct GgufFloatKey {
  const char* suffix;                  ///< e.g. "attention.layer_norm_rms_epsilon"
  float ModelConfig::*field;           ///< the field it sets
  bool required;                       ///< absent -> InputError naming the key; else the field keeps its default
  float default_value = 0.0f;          ///< value used when the key is absent and not required
};

/// A floating-point metadata key "ARCH.SUFFIX" naming a feature sqkit's decoder does not have:
/// present with a non-zero value -> UnsupportedError naming the key, the value and `feature`.
struct GgufRefusedKey {
  const char* suffix;   ///< e.g. "final_logit_softcapping"
  const char* feature;  ///< e.g. "final logit soft-capping"
};

/// How the token embedding is scaled (DecoderSpec::embed_scale).
enum class GgufEmbedScale {
  None,     ///< 1
  SqrtDim,  ///< sqrt(embedding_length) in FP32 (Gemma; llama.cpp `ggml_scale(inpL, sqrtf(n_embd))`)
};

/// Sliding-window attention as llama.cpp derives it for an architecture (llama_hparams::swa_type
/// STANDARD and set_swa_pattern): the window size comes from a metadata key, which layers use it
/// and their RoPE base are hard-coded per architecture in llama.cpp (src/llama-model.cpp,
/// load_hparams), not stored in the file.
struct GgufSlidingWindow {
  /// Integer key "ARCH.SUFFIX" holding the window in tokens; absent or 0 = no sliding window (every
  /// layer global, rope_local_theta unused), as llama.cpp reads it for gemma3. nullptr = the
  /// architecture has no sliding window.
  const char* key_suffix = nullptr;
  /// llama.cpp set_swa_pattern(pattern) (dense_first false): layer l is local (windowed) iff
  /// l % pattern < pattern - 1, i.e. every pattern-th layer is global; 0 = every layer local.
  int pattern = 0;
  /// RoPE base of the local layers (llama.cpp rope_freq_base_train_swa); 0 = rope_theta.
  float local_rope_theta = 0.0f;
};

/// The mapping of one GGUF architecture.
struct GgufArchitecture {
  const char* name;                          ///< `general.architecture` value, e.g. "llama"
  const char* config_architecture;           ///< ModelConfig::architecture it builds
  std::vector<GgufIntKey> int_keys;          ///< applied in order (default_from refers to earlier ones)
  std::vector<GgufFloatKey> float_keys;
  std::vector<GgufTensorRule> global_tensors;  ///< tensors outside the blocks
  std::vector<GgufTensorRule> layer_tensors;   ///< tensors of every block "blk.{i}."
  /// The layer structure. embed_scale, attn_scale, layer_window and rope_local_theta are then set
  /// from the fields below (whatever this holds for them is replaced).
  DecoderSpec spec = {};
  GgufEmbedScale embed_scale = GgufEmbedScale::None;
  /// Softmax scale of q·kᵀ from the config being built (sizes set); nullptr = 0, i.e.
  /// 1/sqrt(head_dim). llama.cpp's f_attention_scale where it hard-codes one.
  float (*attn_scale)(const ModelConfig&) = nullptr;
  GgufSlidingWindow sliding_window = {};
  std::vector<GgufRefusedKey> refused_keys = {};
  /// ModelConfig::qkv_bias of the architecture: q/k/v projections have biases (their rules are in
  /// layer_tensors: "attn_q.bias", ...; Qwen2).
  bool qkv_bias = false;
};

/// The size of symbolic dimension `d` in `config` (e.g. QWidth = n_heads · head_dim): the one
/// resolution of GgufTensorRule::shape, shared by the GGUF reader and the GGUF exporter.
int64_t gguf_dim_size(GgufDim d, const ModelConfig& config);

/// The architecture named `name` (`general.architecture`), or nullptr when sqkit has no mapping.
const GgufArchitecture* find_gguf_architecture(const std::string& name);

/// The names of the supported architectures, comma-separated ("llama, gemma3, qwen2").
std::string supported_gguf_architectures();

}  // namespace sq
