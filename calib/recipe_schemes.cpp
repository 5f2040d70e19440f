// The table scheme -> per-linear quantizer: adding a scheme adds a row here and its own recipe file.
#include "calib/recipe_schemes.h"

#include <functional>
#include <utility>

namespace sq {

std::unique_ptr<LinearQuantizer> make_linear_quantizer(ConvertScheme scheme) {
  static const std::pair<ConvertScheme, std::function<std::unique_ptr<LinearQuantizer>()>> kSchemes[] = {
      {ConvertScheme::F32, [] { return make_float_quantizer(ConvertScheme::F32); }},
      {ConvertScheme::F16, [] { return make_float_quantizer(ConvertScheme::F16); }},
      {ConvertScheme::BF16, [] { return make_float_quantizer(ConvertScheme::BF16); }},
      {ConvertScheme::W8A8, make_w8a8_quantizer},
      {ConvertScheme::W4A16, make_int4_quantizer},
      {ConvertScheme::W4A4Atom, make_atom_quantizer},
  };
  for (const auto& [s, make] : kSchemes)
    if (s == scheme) return make();
  throw std::logic_error(std::string("no quantizer for scheme ") + scheme_name(scheme));
}

}  // namespace sq
