// INT8 activation quantization and the dequantization epilogue of W8A8 linears on the device
// (SmoothQuant Eq. 3.1 and its inverse, §3.1 / Figure 3.1), with the element math of
// cuda/quant_element.h, i.e. the same expressions as the CPU (quant/int8_quantize.h,
// quant/int8_gemm.h Int8Dequant): given the same input, the device produces bit-identical INT8
// codes and steps, and — the INT32 GEMM being exact — bit-identical outputs.
//
// Every pointer is device memory; ops are enqueued on `stream`. Sizes are checked on the host
// (std::invalid_argument); a kernel cannot throw, so where the CPU throws for NaN/inf activations in
// a dynamic mode, the device yields a NaN step (and NaN outputs) instead.
#pragma once

#include <cstdint>

#include "cuda/cuda_runtime.h"
#include "quant/int8_quantize.h"

namespace sq::cuda {

/// Quantizes activations x [n, k] FP32 (row-major) into q [n, ldq] INT8 (row-major, ldq ≥ k) per
/// `mode` (Eq. 3.1, as sq::quantize_activations):
///   PerToken:          scales[i] = Δ_i = absmax(x[i, :]) / 127 (1 for an all-zero row), [n] steps;
///   PerTensorDynamic:  scales[0] = absmax(x) / 127 over the whole block (1 when all zero), [1];
///   PerTensorStatic:   scales[0] = static_step (the calibrated Δ; values beyond ±127·Δ clamp), [1];
/// q[i, j] = clamp(round_half_even(x[i, j] / Δ), −127, 127) for j < k, and 0 for k ≤ j < ldq (the
/// zero padding the INT8 GEMM needs, cuda_int8_gemm.h). One thread block per row; the per-tensor
/// dynamic absmax is an atomicMax over the rows' maxima (exact, order-independent), in scales[0].
/// NaN/inf in a dynamic mode: the affected step is NaN (documented above).
/// Throws std::invalid_argument for negative sizes, ldq < k, or (static) a step that is not finite
/// and > 0; CudaError when a launch fails.
void quantize_activations_int8(const float* x, int64_t n, int64_t k, ActQuant mode, float static_step, int8_t* q, int64_t ldq,
                               float* scales, Stream stream = {});

/// The dequantization epilogue of an INT8 GEMM (Int8Dequant, quant/int8_gemm.h):
///   y[i, j] = fma(float(acc[i, j]), sa·sb, bias[j])  or  float(acc[i, j])·(sa·sb) without bias,
///   sa = a_scales[a_per_row ? i : 0], sb = b_scales[b_per_col ? j : 0],
/// for i < n, j < m. acc: [n, ld_acc] INT32 row-major (ld_acc ≥ m; columns ≥ m are ignored, e.g.
/// the padded output channels); a_scales [n] or [1]; b_scales [m] or [1]; bias [m] or nullptr;
/// y: [n, m] FP32 row-major. Throws std::invalid_argument for negative sizes or ld_acc < m.
void dequantize_int8_gemm(const int32_t* acc, int64_t ld_acc, int64_t n, int64_t m, const float* a_scales, bool a_per_row,
                          const float* b_scales, bool b_per_col, const float* bias, float* y, Stream stream = {});

}  // namespace sq::cuda
