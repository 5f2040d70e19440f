#include "core/checkpoint.h"

#include "core/error.h"

namespace sq {

const Tensor& Checkpoint::get(const std::string& name, const std::vector<int64_t>& expected_shape) const {
  auto it = tensors.find(name);
  if (it == tensors.end())
    throw InputError(source + ": tensor '" + name + "' is missing (expected shape " + shape_to_string(expected_shape) + ")");
  if (it->second.shape() != expected_shape)
    throw InputError(source + ": tensor '" + name + "' has shape " + it->second.shape_string() + ", expected " +
                     shape_to_string(expected_shape));
  return it->second;
}

}  // namespace sq
