// W8A8 linear layer on a CUDA device (SmoothQuant §3.1 / §3.3, Eq. 3.1; host: model/w8a8_linear.h):
//
//   y[i, j] = fma(float(acc[i, j]), Δx[i or 0]·Δw[j or 0], b[j]),   acc = Xq · Wqᵀ (exact INT32)
//
// forward(x, n, y) enqueues three steps on the stream:
//   1. activation quantization on the device (cuda_int8_quantize.h): per token, per tensor dynamic
//      or per tensor static, into Xq [n, k_pad] INT8 with zero columns [in, k_pad);
//   2. the cuBLASLt INT8 tensor-core GEMM (cuda_int8_gemm.h, TN form) into acc [n, m_pad] INT32;
//   3. the dequantization epilogue (same expression as the CPU's Int8Dequant) into y [n, out] FP32.
// Wq is uploaded once as [m_pad, k_pad] INT8 (m_pad, k_pad = out, in rounded up to 16; zero
// padding). Since the INT8 codes, the steps and the INT32 sums equal the CPU's exactly, the output
// equals W8A8Linear::forward up to the rounding of the epilogue's two float operations, which are
// the same on both sides: bit-identical in practice.
//
// Scratch (Xq, steps, acc, the 32 MiB cuBLASLt workspace) is shared by all W8A8 device linears of a
// host thread, one set per stream (grown on demand, after synchronizing that stream), so a model's
// linears do not each hold an [n, m] INT32 buffer. Consequently calls from one host thread on one
// stream are ordered by the stream, and calls on different streams use different scratch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cuda/cuda_linear.h"
#include "quant/int8_quantize.h"

namespace sq::cuda {

/// The host data of a W8A8 linear, as W8A8Linear exposes it (pointers stay owned by the caller and
/// are read during make_w8a8_device_linear only).
struct W8A8HostWeights {
  const int8_t* q = nullptr;        ///< Wq [out, in] row-major INT8 in [−127, 127]
  const float* scales = nullptr;    ///< Δw: [out] when per_channel, else [1]
  bool per_channel = true;          ///< WeightGranularity::PerChannel
  ActQuant act = ActQuant::PerToken;
  float static_step = 0.0f;         ///< Δx for PerTensorStatic (finite, > 0), else ignored
  const float* bias = nullptr;      ///< [out] FP32 or nullptr
  int64_t out = 0, in = 0;
  std::string format;               ///< the host layer's format(), e.g. "w8a8-per-channel-per-token"
};

/// Uploads a W8A8 linear (see the file comment). Throws std::invalid_argument for non-positive
/// sizes, in > 131072, or a static mode without a finite step > 0; UnsupportedError without CUDA
/// or device; CudaError when the device runs out of memory or cuBLASLt fails.
std::unique_ptr<DeviceLinear> make_w8a8_device_linear(const W8A8HostWeights& w);

}  // namespace sq::cuda
