// sq-convert's quantization choices as given on the command line (--scheme, --alpha, --no-smooth,
// --preset, --weight, --act), parsed and checked in one library function so that the tool, the tests
// and the fuzz target (tests/fuzz/convert_spec_fuzz.cpp) share it. Depends on nothing but the enums.
#pragma once

#include <string>

#include "quant/int8_quantize.h"

namespace sq {

/// Output encoding of sq-convert: plain re-encoding (f32 / f16 / bf16), SmoothQuant W8A8,
/// group-wise INT4 weights with FP32 activations (W4A16: RTN or GPTQ), or Atom's W4A4 with INT8
/// outlier channels (W4A4Atom).
enum class ConvertScheme { F32, F16, BF16, W8A8, W4A16, W4A4Atom };
/// Parses "f32" / "f16" / "bf16" / "w8a8" / "w4a16" / "w4a4-atom" (exact, lower case); throws
/// UsageError otherwise.
ConvertScheme parse_scheme(const std::string& s);
/// "f32", "f16", "bf16", "w8a8", "w4a16" or "w4a4-atom".
const char* scheme_name(ConvertScheme s);
/// True for the plain re-encodings (f32, f16, bf16).
inline bool is_float_scheme(ConvertScheme s) { return s == ConvertScheme::F32 || s == ConvertScheme::F16 || s == ConvertScheme::BF16; }

/// The option texts exactly as the user typed them (the defaults are sq-convert's).
struct ConvertFlags {
  std::string scheme = "w8a8";  ///< --scheme
  std::string alpha = "0.5";    ///< --alpha: a number in [0, 1] or "auto"
  bool alpha_given = false;     ///< --alpha appeared on the command line
  bool no_smooth = false;       ///< --no-smooth
  std::string preset;           ///< --preset: "", "O1", "O2" or "O3"
  std::string weight;           ///< --weight: "", "per-channel" or "per-tensor" (overrides the preset)
  std::string act;              ///< --act: "", "per-token", "per-token-group", "per-tensor-dynamic" or "per-tensor-static"
};

/// The checked result of parse_convert_flags (copied into ConvertOptions by sq-convert).
struct ConvertSpec {
  ConvertScheme scheme = ConvertScheme::W8A8;
  bool smooth = true;       ///< false with --no-smooth
  float alpha = 0.5f;       ///< migration strength, in [0, 1]
  bool alpha_auto = false;  ///< --alpha auto
  std::string preset;       ///< "O1" / "O2" / "O3" or ""
  WeightGranularity weight = WeightGranularity::PerChannel;
  ActQuant act = ActQuant::PerToken;
};

/// Checks and interprets `flags`: the scheme (parse_scheme); --alpha given together with
/// --no-smooth is refused; --alpha is "auto" or a whole-string decimal number in [0, 1]; a preset
/// sets per-tensor weights and O1 per-token / O2 per-tensor-dynamic / O3 per-tensor-static
/// activations; --weight and --act then override. Throws UsageError naming the option and the
/// value for anything else. Never throws anything but UsageError.
ConvertSpec parse_convert_flags(const ConvertFlags& flags);

}  // namespace sq
