// The rotations a converted .sqm carries (sq-convert --rotate; calib/recipe_rotation.h), as its
// header records them in quantization.rotation (docs/formats.md):
//
//   "rotation": {"method": "hadamard",
//                "online":  {"ffn_hidden": 512},    // site -> block: the runner rotates this input
//                "offline": {"attn_output": 64},    // folded into the weights; nothing to run
//                "kv_keys": 64}                     // queries and keys rotated per head after RoPE
//
// "online" sites change what a reader must compute (model/hadamard_input_linear.h): a reader that
// cannot run them (an export format without such an op) must refuse the file. "offline" ones are
// informational only. "kv_keys" (QuaRot §3's online rotation of queries and keys) changes nothing
// a reader computes: R is orthogonal, so (R·q)·(R·k) = q·k; the runner applies it only where its KV
// cache quantizes keys after RoPE, so that the cache stores rotated keys (Decoder::set_key_rotation).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace sq {

struct RotationHeader {
  std::string method;                       ///< "hadamard", or "" when the file has no rotation
  std::map<std::string, int64_t> online;   ///< activation site name -> Hadamard block
  std::map<std::string, int64_t> offline;  ///< activation site name -> Hadamard block
  int64_t kv_keys = 0;                      ///< block of the per-head query/key rotation; 0 = none
};

/// quantization.rotation of header `quant` (a header's "quantization" object). Throws InputError
/// naming `path` when it is malformed: not an object, a method other than "hadamard", a site not
/// one of attn_input / attn_output / ffn_input / ffn_hidden, a block (or kv_keys) that is not a
/// positive power of two.
RotationHeader rotation_from_quantization(const nlohmann::json& quant, const std::string& path);

/// Throws UnsupportedError "<path>: ... online Hadamard rotation ... has no <format> export" when
/// the file rotates some activation online (format: e.g. "GGUF").
void refuse_online_rotation(const nlohmann::json& quant, const std::string& path, const std::string& format);

}  // namespace sq
