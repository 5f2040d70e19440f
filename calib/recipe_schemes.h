// The quantizer factory of each scheme (one recipe file each; calib/recipe.h).
#pragma once

#include "calib/recipe.h"

namespace sq {

std::unique_ptr<LinearQuantizer> make_float_quantizer(ConvertScheme scheme);  ///< calib/recipe_float.cpp
std::unique_ptr<LinearQuantizer> make_w8a8_quantizer();                       ///< calib/recipe_w8a8.cpp
std::unique_ptr<LinearQuantizer> make_int4_quantizer();                       ///< calib/recipe_int4.cpp
std::unique_ptr<LinearQuantizer> make_atom_quantizer();                       ///< calib/recipe_atom.cpp

}  // namespace sq
