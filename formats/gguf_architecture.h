// GGUF architecture mappings: how one `general.architecture` of a GGUF file (llama.cpp naming,
// llama.cpp's src/llama-arch.cpp and the GGUF spec's "Standardized key-value pairs") maps onto
// sqkit's ModelConfig and canonical tensor names (core/checkpoint.h).
//
// Everything architecture-specific is data in a GgufArchitecture table; formats/gguf_checkpoint.cpp
// interprets the table. A new architecture (issue 16: gemma3) is one more table entry (plus
// whatever ModelConfig fields its math needs).
#pragma once

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

/// The mapping of one GGUF architecture.
struct GgufArchitecture {
  const char* name;                          ///< `general.architecture` value, e.g. "llama"
  const char* config_architecture;           ///< ModelConfig::architecture it builds
  std::vector<GgufIntKey> int_keys;          ///< applied in order (default_from refers to earlier ones)
  std::vector<GgufFloatKey> float_keys;
  std::vector<GgufTensorRule> global_tensors;  ///< tensors outside the blocks
  std::vector<GgufTensorRule> layer_tensors;   ///< tensors of every block "blk.{i}."
};

/// The architecture named `name` (`general.architecture`), or nullptr when sqkit has no mapping.
const GgufArchitecture* find_gguf_architecture(const std::string& name);

/// The names of the supported architectures, comma-separated ("llama").
std::string supported_gguf_architectures();

}  // namespace sq
