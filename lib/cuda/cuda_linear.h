// Linear layers whose weights live on a CUDA device (issue #7, scope item 2): the device
// counterpart of model/linear.h, one implementation per host format:
//
//   host Linear (format())           device implementation (file)
//   DenseLinear ("f32")              cuBLAS sgemm, FP32 math, TF32 off (cuda_ops.h linear_f32)
//   W8A8Linear ("w8a8-…")            INT8 activation quantization on the device + cuBLASLt INT8
//                                    tensor-core GEMM (INT32 accumulators) + FP32 dequantization
//                                    epilogue (cuda_w8a8_linear.h)
//   W4A16Linear ("w4a16-g…")         dequantize-in-kernel GEMV (n == 1) / shared-memory tiled GEMM
//                                    (n > 1) on the packed INT4 weights (cuda_w4a16_linear.h)
//   anything else (Atom W4A4, …)     refused: UnsupportedError naming the layer and its format
//
// Plain C++ (no CUDA headers): device-neutral code includes it in every build; without CUDA,
// upload_linear throws UnsupportedError (cuda_stub.cpp / DeviceArray).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cuda/cuda_runtime.h"

namespace sq {
class Linear;
}

namespace sq::cuda {

/// A linear layer y = x · Wᵀ (+ b) whose weights live on the device. Not thread-safe: an instance
/// may own scratch memory, so one host thread uses it at a time.
class DeviceLinear {
 public:
  virtual ~DeviceLinear() = default;
  /// Input features k (columns of W).
  virtual int64_t in_features() const = 0;
  /// Output features m (rows of W).
  virtual int64_t out_features() const = 0;
  /// The host layer's Linear::format() ("f32", "w8a8-per-channel-per-token", "w4a16-g128-sym", …).
  virtual std::string format() const = 0;
  /// x: [n, in] device FP32 row-major → y: [n, out] device FP32 row-major (overwritten; must not
  /// alias x). Enqueued on `stream`, returns without waiting. n ≥ 0 (std::invalid_argument when
  /// negative). Throws CudaError when a launch or a cuBLAS/cuBLASLt call fails. Non-const: an
  /// implementation may grow scratch buffers.
  virtual void forward(const float* x, int64_t n, float* y, Stream stream = {}) = 0;
};

/// Throws UnsupportedError "CUDA backend: <name> is a '<format>' linear; ..." unless `linear` has a
/// format upload_linear runs (f32, w8a8-*, w4a16-*, w8a16-*). Needs no device.
void check_device_linear_format(const sq::Linear& linear, const std::string& name);

/// Uploads a host linear layer to the device (weights copied once, in their own format; nothing is
/// expanded to FP32 except for DenseLinear, which is FP32 already):
///   DenseLinear → cuBLAS sgemm; W8A8Linear → INT8 tensor-core path; W4A16Linear → INT4 path.
/// `name` names the layer in error messages (e.g. "layer 3 q_proj").
/// Throws UnsupportedError for any other format, e.g. Atom W4A4 ("CUDA backend: layer 3 q_proj is
/// a 'w4a4-g128-o128' linear; …"; checked before the device, so on every machine), and when sqkit
/// was built without CUDA or no device is usable; std::invalid_argument for inconsistent quantized
/// data; CudaError when the device runs out of memory or cuBLASLt fails.
std::unique_ptr<DeviceLinear> upload_linear(const sq::Linear& linear, const std::string& name);

}  // namespace sq::cuda
