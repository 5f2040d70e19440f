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

Checkpoint Checkpoint::layer(int l) const {
  Checkpoint out;
  out.config = config;
  out.source = source;
  out.format = format;
  const std::string prefix = names::layer(l);
  for (auto it = tensors.lower_bound(prefix); it != tensors.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    out.tensors.insert(*it);
  return out;
}

}  // namespace sq
