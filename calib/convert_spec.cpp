#include "calib/convert_spec.h"

#include <exception>

#include "core/error.h"

namespace sq {

ConvertScheme parse_scheme(const std::string& s) {
  if (s == "f32") return ConvertScheme::F32;
  if (s == "f16") return ConvertScheme::F16;
  if (s == "bf16") return ConvertScheme::BF16;
  if (s == "w8a8") return ConvertScheme::W8A8;
  if (s == "w4a16") return ConvertScheme::W4A16;
  if (s == "w4a4-atom") return ConvertScheme::W4A4Atom;
  throw UsageError("--scheme must be f32, f16, bf16, w8a8, w4a16 or w4a4-atom, got '" + s + "'");
}

const char* scheme_name(ConvertScheme s) {
  switch (s) {
    case ConvertScheme::F32: return "f32";
    case ConvertScheme::F16: return "f16";
    case ConvertScheme::BF16: return "bf16";
    case ConvertScheme::W8A8: return "w8a8";
    case ConvertScheme::W4A16: return "w4a16";
    case ConvertScheme::W4A4Atom: return "w4a4-atom";
  }
  return "?";
}

ConvertSpec parse_convert_flags(const ConvertFlags& f) {
  ConvertSpec spec;
  spec.scheme = parse_scheme(f.scheme);
  spec.smooth = !f.no_smooth;
  if (f.no_smooth && f.alpha_given) throw UsageError("--alpha has no effect with --no-smooth; give one or the other");
  if (f.alpha == "auto") {
    spec.alpha_auto = true;
  } else {
    size_t used = 0;
    try {
      spec.alpha = std::stof(f.alpha, &used);
    } catch (const std::exception&) {  // std::invalid_argument, std::out_of_range
      used = 0;
    }
    if (used == 0 || used != f.alpha.size())
      throw UsageError("--alpha must be a number in [0, 1] or 'auto', got '" + f.alpha + "'");
    if (!(spec.alpha >= 0.0f && spec.alpha <= 1.0f)) throw UsageError("--alpha must be in [0, 1], got " + f.alpha);
  }
  if (!f.preset.empty()) {
    if (f.preset != "O1" && f.preset != "O2" && f.preset != "O3")
      throw UsageError("--preset must be O1, O2 or O3, got '" + f.preset + "'");
    spec.preset = f.preset;
    spec.weight = WeightGranularity::PerTensor;  // Table 3.2: per-tensor weights at every level
    spec.act = f.preset == "O1"   ? ActQuant::PerToken
               : f.preset == "O2" ? ActQuant::PerTensorDynamic
                                  : ActQuant::PerTensorStatic;
  }
  if (!f.weight.empty()) {
    if (f.weight == "per-channel") spec.weight = WeightGranularity::PerChannel;
    else if (f.weight == "per-tensor") spec.weight = WeightGranularity::PerTensor;
    else throw UsageError("--weight must be per-channel or per-tensor, got '" + f.weight + "'");
  }
  if (!f.act.empty()) {
    if (f.act == "per-token") spec.act = ActQuant::PerToken;
    else if (f.act == "per-tensor-dynamic") spec.act = ActQuant::PerTensorDynamic;
    else if (f.act == "per-tensor-static") spec.act = ActQuant::PerTensorStatic;
    else if (f.act == "per-token-group") spec.act = ActQuant::PerTokenGroup;
    else throw UsageError("--act must be per-token, per-token-group, per-tensor-dynamic or per-tensor-static, got '" + f.act + "'");
  }
  return spec;
}

}  // namespace sq
