// Which device runs a model: the `--device cpu|cuda` option of sq-eval and sq-run.
#pragma once

#include <string>

namespace sq {

enum class Device { Cpu, Cuda };

/// Parses "cpu" / "cuda" for option `option` (e.g. "--device"). Throws UsageError for any other
/// name; for "cuda", throws UnsupportedError (exit status 2) when sqkit was built without CUDA or no
/// CUDA device is usable (require_cuda, cuda/cuda_runtime.h), so a CUDA request never silently runs
/// on the CPU.
Device select_device(const std::string& name, const std::string& option = "--device");

}  // namespace sq
