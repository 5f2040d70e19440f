// Model config dimensions checked against a checkpoint's tensor inventory (names and shapes from
// file headers) before anything is allocated or looped over per layer.
//
// A config.json is a few hundred bytes an attacker (or a typo) controls; the tensors are what the
// model actually is. A num_hidden_layers of 1e9 over a 2-layer file would otherwise make the
// loader build a billion-entry tensor list (minutes, gigabytes) before reporting the first missing
// tensor. These checks read headers only, so they finish in microseconds.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/model_config.h"

namespace sq {

/// The index N of a tensor name "PREFIX{N}.REST" (N: 1 to 9 decimal digits), e.g. 3 for
/// ("model.layers.3.mlp.up_proj.weight", "model.layers.") or ("blk.3.ffn_up.weight", "blk."); -1
/// when the name is not of that form. When `rest` is given it receives REST ("ffn_up.weight").
int64_t numbered_name_index(const std::string& name, const std::string& prefix, std::string* rest = nullptr);

/// Names of the config keys checked, in the vocabulary of the file being read (HF config.json
/// keys, or .sqm model_config fields).
struct ConfigKeyNames {
  const char* n_layers = "num_hidden_layers";
  const char* dim = "hidden_size";
  const char* vocab_size = "vocab_size";
  const char* n_heads = "num_attention_heads";
  const char* n_kv_heads = "num_key_value_heads";
  const char* hidden_dim = "intermediate_size";
  /// Prefix of layer i's tensor names, followed by "{i}." (an HF architecture's own names, e.g.
  /// "transformer.h." for GPT-2, are checked before they are mapped onto the canonical ones).
  const char* layer_prefix = "model.layers.";
};

/// Throws InputError "CONFIG: KEY = N, but the checkpoint's tensors hold M layers (model.layers.0 …
/// model.layers.M-1)" when `n_layers` exceeds the number of distinct layer indices i among the
/// tensor names "PREFIX{i}.*" of `tensor_names` (`prefix`: core/checkpoint.h's "model.layers." by
/// default). A config with fewer layers
/// than the file is accepted (transformers ignores the extra weights). `config_source` names the
/// config (file path), `key` the config key. O(tensor_names) time, no per-layer allocation.
void check_layer_count(int n_layers, const std::vector<std::string>& tensor_names, const std::string& config_source,
                       const char* key, const std::string& prefix = "model.layers.");

/// check_layer_count (with keys.layer_prefix), then the FP32-checkpoint dimensions against the shapes of the tensors that
/// are present (`shape_of(name)` returns the header shape or nullptr when absent; absent tensors
/// are left to the loader's "missing tensor" error):
///   model.embed_tokens.weight              [vocab_size, hidden_size]
///   model.layers.0.self_attn.q_proj.weight [num_attention_heads × head_dim, hidden_size]
///   model.layers.0.self_attn.k_proj.weight [num_key_value_heads × head_dim, hidden_size]
///   model.layers.0.mlp.gate_proj.weight    [intermediate_size, hidden_size]
/// Throws InputError naming `config_source`, the config key and its value, the tensor and its
/// shape on the first mismatch.
void check_config_against_tensors(const ModelConfig& c, const std::vector<std::string>& tensor_names,
                                  const std::function<const std::vector<int64_t>*(const std::string&)>& shape_of,
                                  const std::string& config_source, const ConfigKeyNames& keys = {});

}  // namespace sq
