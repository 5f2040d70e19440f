// KV-cache storage formats: what `--kv SPEC` and its companion options select.
//
//   fp32        keys and values as FP32 (keys stored after RoPE unless keys = pre-rope; the reference)
//   int8 … int2 uniform per-token asymmetric quantization (Atom §4.4; KVQuant Table 2 baselines):
//               each token's K (and V) vector is split into groups of `group` channels (default:
//               one group per KV head), each group stores an FP16 scale and an FP16 zero point
//               (the group minimum) and b-bit codes; keys are quantized after RoPE by default
//   nuq4 … nuq2 KVQuant (Hooper et al. 2024) non-uniform: per-layer Fisher-weighted codebooks of 2^b
//               signposts in [−1, 1] (§3.3); keys per-channel with offline scaling, before RoPE
//               (§3.1–3.2); values per-token with online scaling (§3.7); optional per-vector
//               dense-and-sparse outliers (§3.4), Q-Norm (§3.5)
//
// Every quantized format can keep the first `sink_fp16` tokens in FP16 (attention-sink-aware
// quantization, KVQuant §3.6).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/model_config.h"

namespace sq {

/// The family of a KV storage format.
enum class KVKind { F32, Int, Nuq };

/// Where keys are quantized relative to RoPE (KVQuant §3.2).
enum class KVKeyRope { PreRope, PostRope };

/// The axis along which keys are scaled (KVQuant §3.1): per-channel (offline, calibrated) or
/// per-token (online, like values).
enum class KVKeyAxis { PerChannel, PerToken };

/// A complete KV-cache format. Defaults give the format the paper (or baseline) uses.
struct KVSpec {
  KVKind kind = KVKind::F32;
  int bits = 32;                 ///< 8, 4, 3, 2 for Int; 4, 3, 2 for Nuq; 32 for F32
  int group = 0;                 ///< Int only: channels per scale/zero group; 0 = head_dim (per head)
  KVKeyRope keys = KVKeyRope::PostRope;         ///< Int default post-RoPE, Nuq default pre-RoPE
  KVKeyAxis key_axis = KVKeyAxis::PerToken;     ///< Int default per-token, Nuq default per-channel
  double outlier_fraction = 0;   ///< Nuq only: fraction kept as sparse FP16 outliers (§3.4), 0 = none
  bool qnorm = false;            ///< Nuq only: Q-Norm centroids (§3.5, Eq. 3)
  int sink_fp16 = 0;             ///< first tokens (text positions) kept in FP16 (§3.6); Nuq default 1

  bool quantized() const { return kind != KVKind::F32; }
};

/// Parses "fp32" (alias "f32"), "int8", "int4", "int3", "int2", "nuq4", "nuq3", "nuq2" into a spec
/// with that format's defaults (nuq: pre-RoPE per-channel keys, 1 FP16 sink token). Throws
/// UsageError naming `option` and the accepted values otherwise.
KVSpec parse_kv_spec(const std::string& text, const std::string& option = "--kv");

/// Applies the companion options to `spec` and validates the combination: `group` (Int only, > 0,
/// must divide the KV width), `outliers` ∈ [0, 0.5) (Nuq only), `qnorm` (Nuq only), `sink` ≥ 0,
/// keys "pre-rope"/"post-rope", key axis "per-channel"/"per-token" (per-channel needs offline
/// scaling, i.e. Nuq). Empty strings / negative numbers mean "keep the default". Throws
/// UsageError naming the option at fault.
void apply_kv_options(KVSpec& spec, int group, double outliers, bool qnorm, int sink, const std::string& keys,
                      const std::string& key_axis);

/// Checks `spec` against a model's KV width (n_kv_heads · head_dim). Throws UsageError when the
/// group size does not divide the width or the width exceeds what a sparse outlier index holds.
void check_kv_spec(const KVSpec& spec, const ModelConfig& config);

/// Refuses an explicit `--kv-keys` (`keys`, "" = not given) on a model without rotary embedding
/// (ALiBi or learned positions): its keys are never rotated, so "pre-rope" and "post-rope" store the
/// same keys and the option cannot mean anything. Throws UsageError (one line) naming the option,
/// the architecture and its positions. Specs that say pre-rope without the user asking (nuq's
/// default, .sqm headers) are accepted on such models and behave exactly like post-rope
/// (docs/protocols.md, "Streaming on every architecture").
void check_kv_keys_option(const std::string& keys, const ModelConfig& config);

/// The spec as the short name used in tables and file headers, e.g. "nuq3-1%-qnorm", "int4-g64",
/// "fp32"; with ",sink16:N" when sinks are kept and ",post-rope"/",per-token" for non-default
/// ablation switches.
std::string kv_spec_name(const KVSpec& spec);

/// Dense bytes of one token's K or V vector of one layer (excluding sparse outliers and sink
/// storage): F32 4·width; Int ⌈width·b/8⌉ + 4·(width/group) (FP16 scale + FP16 zero per group);
/// Nuq ⌈width·b/8⌉, plus 4 for values (FP16 scale + FP16 offset per token) and for per-token keys.
int64_t kv_row_bytes(const KVSpec& spec, int64_t width, int64_t head_dim, bool is_value);

/// The spec as the .sqm header's `kv_cache` object (docs/formats.md): {"format": "nuq3", "bits": 3,
/// "group": 0, "keys": "pre-rope", "key_axis": "per-channel", "outlier_fraction": 0.01,
/// "qnorm": false, "sink_fp16": 1}.
nlohmann::json kv_spec_to_json(const KVSpec& spec);
/// Reads a `kv_cache` header object written by kv_spec_to_json. Throws InputError naming `source`
/// and the field when a field is missing, has the wrong type or an unsupported value.
KVSpec kv_spec_from_json(const nlohmann::json& j, const std::string& source);

/// "pre-rope"/"post-rope", "per-channel"/"per-token".
const char* kv_key_rope_name(KVKeyRope r);
const char* kv_key_axis_name(KVKeyAxis a);

}  // namespace sq
