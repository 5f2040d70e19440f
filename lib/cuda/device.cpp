#include "cuda/device.h"

#include "core/error.h"
#include "cuda/cuda_runtime.h"

namespace sq {

Device select_device(const std::string& name, const std::string& option) {
  if (name == "cpu") return Device::Cpu;
  if (name != "cuda") throw UsageError(option + " must be cpu or cuda, got '" + name + "'");
  require_cuda(option + " cuda");
  return Device::Cuda;
}

}  // namespace sq
