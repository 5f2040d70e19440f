// RoPE settings of a Hugging Face `config.json`: base θ and frequency scaling, from the
// transformers >= 5 `rope_parameters` object or the legacy `rope_scaling` object + top-level
// `rope_theta` (transformers < 5). make_hf_config_json (formats/hf_config.h) writes them back.
//
// Reference: transformers' modeling_rope_utils.py (ROPE_INIT_FUNCTIONS, the `_compute_*_parameters`
// functions and their `_validate_*` key lists) and configuration_utils' rope standardization.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/model_config.h"

namespace sq {

/// θ and scaling read from a HF config.
struct HfRope {
  float theta = 10000.0f;
  RopeScaling scaling;
  /// Fraction of each head's channels that is rotated (transformers: rotary dim =
  /// int(head_dim * factor)); 1 unless HfRopeOptions::partial_rotary allows another value.
  double partial_rotary_factor = 1.0;
};

/// What an architecture's config may say about RoPE beyond LLaMA's keys.
struct HfRopeOptions {
  /// Accept partial_rotary_factor in (0, 1] (GPT-NeoX, Phi-3); otherwise it must be 1.
  bool partial_rotary = false;
  /// partial_rotary_factor when the config gives none (GPT-NeoX: 0.25).
  double default_partial_rotary = 1.0;
  /// Legacy top-level key read like partial_rotary_factor ("rotary_pct", GPT-NeoX), or null.
  const char* legacy_partial_key = nullptr;
  /// Legacy top-level key read like rope_theta ("rotary_emb_base", GPT-NeoX), or null.
  const char* legacy_theta_key = nullptr;
  /// θ when the config gives none.
  float default_theta = 10000.0f;
};

/// One RoPE object (`rope_parameters`, `rope_scaling`, or one per-layer-type entry of Gemma 3's
/// rope_parameters): its scaling, and θ / partial_rotary_factor when it gives them.
struct HfRopeObject {
  std::optional<float> theta;
  RopeScaling scaling;
  std::optional<double> partial_rotary_factor;
};

/// Parses one RoPE object `obj`; `key` ("rope_parameters", "rope_parameters.full_attention")
/// names its keys in messages. Keys allowed per rope_type as in parse_hf_rope. Throws
/// UnsupportedError for another rope_type or a key the type does not define, InputError for a
/// non-object, a missing required key, a wrong JSON type or a partial_rotary_factor outside (0, 1].
HfRopeObject parse_hf_rope_object(const nlohmann::json& obj, const std::string& key, const std::string& source);

/// Reads the RoPE settings of the HF config object `config`; `source` (the file path) prefixes
/// every message.
///
/// The scaling object is `rope_parameters` when present and not null, else `rope_scaling`; when
/// both are given they must describe the same RoPE. Its `rope_type` (or legacy `type`; "default"
/// when absent) selects the keys it may hold:
///   default  rope_theta, partial_rotary_factor
///   linear   + factor                                                         (required)
///   llama3   + factor, low_freq_factor, high_freq_factor,
///              original_max_position_embeddings                             (all required)
/// θ is the scaling object's `rope_theta`, else the top-level `rope_theta`, else 10000; both given
/// and different is an error. `partial_rotary_factor` (in the object or top-level) must be 1 unless
/// `options.partial_rotary`; the options also name legacy keys and defaults (GPT-NeoX's
/// rotary_pct / rotary_emb_base).
///
/// Throws UnsupportedError naming `source` and the key for: a rope_type other than default /
/// linear / llama3 (dynamic, yarn, longrope, ...), a key the rope_type does not define (e.g.
/// rope_parameters.attention_factor, or the per-layer-type objects of Gemma 3), a
/// partial_rotary_factor other than 1 (when not allowed). Throws InputError naming `source` and the key for: a
/// scaling entry that is not an object or null, a missing required key, a value of the wrong JSON
/// type or outside float range, `rope_type` and `type` or `rope_parameters` and `rope_scaling` or
/// two θ that disagree. Values are not range-checked here (ModelConfig::validate does).
HfRope parse_hf_rope(const nlohmann::json& config, const std::string& source, const HfRopeOptions& options = {});

}  // namespace sq
