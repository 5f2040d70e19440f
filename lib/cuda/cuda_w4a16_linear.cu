// CUDA implementation of cuda/cuda_w4a16_linear.h.
#include <cuda_runtime.h>

#include <climits>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_reduce.cuh"
#include "cuda/cuda_w4a16_linear.h"
#include "cuda/quant_element.h"

namespace sq::cuda {

using cuda_detail::check_launch;
using cuda_detail::stream_of;
using cuda_detail::warp_sum;

namespace {

constexpr int kGemvWarps = 8;  ///< GEMV: rows (warps) per block of 256 threads
constexpr int kTileM = 64;     ///< GEMM: output rows per block
constexpr int kTileN = 16;     ///< GEMM: tokens per block
constexpr int kTileK = 64;     ///< GEMM: input columns per shared-memory chunk
constexpr int kGemmThreads = 256;  ///< = kTileN · (kTileM / 4): each thread owns 4 rows × 1 token
static_assert(kGemmThreads == kTileN * (kTileM / 4), "thread ↔ output mapping");

/// The packed weights as the kernels read them (device pointers).
struct Int4View {
  const uint8_t* packed;       ///< [out, in/2]
  const uint16_t* scales_f16;  ///< [out, G]
  const uint8_t* zeros;        ///< [out·G] flat U4 (asymmetric, integer zero points) or nullptr
  const uint16_t* mins_f16;    ///< [out, G] FP16 float minimum (Q4_1 / Q4_K layouts) or nullptr
  int64_t out, in, group, groups;
  bool asym;
};

/// y[r] = Σ_c x[c] · W'[r, c] for r < out: warp w of block b owns row b·kGemvWarps + w.
__global__ void w4a16_gemv_kernel(Int4View w, const float* x, float* y) {
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  if (r >= w.out) return;  // uniform per warp: the shuffles below see full warps only
  float p = qe::int4_row_partial_dot(w.packed, w.scales_f16, w.zeros, w.mins_f16, w.in, w.group, w.groups, w.asym, r, x, lane, 32);
  p = warp_sum(p);
  if (lane == 0) y[r] = p;
}

/// y[i, r] for the block's tile: rows o0 … o0+63 (blockIdx.x), tokens t0 … t0+15 (blockIdx.y).
__global__ void w4a16_gemm_kernel(Int4View w, const float* x, int64_t n, float* y) {
  __shared__ float ws[kTileM][kTileK + 1];  // W' tile (+1 column against bank conflicts)
  __shared__ float xs[kTileN][kTileK + 1];  // X tile
  const int64_t o0 = int64_t(blockIdx.x) * kTileM, t0 = int64_t(blockIdx.y) * kTileN;
  const int tid = threadIdx.x, tx = tid % kTileN, ty = tid / kTileN;  // token tx, rows 4·ty … 4·ty+3
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t k0 = 0; k0 < w.in; k0 += kTileK) {
    const int kmax = static_cast<int>(w.in - k0 < kTileK ? w.in - k0 : kTileK);  // same for the whole block
    for (int idx = tid; idx < kTileM * kTileK; idx += kGemmThreads) {
      const int rr = idx / kTileK, cc = idx % kTileK;
      const int64_t r = o0 + rr, c = k0 + cc;
      ws[rr][cc] = (r < w.out && cc < kmax)
                       ? qe::int4_weight_at(w.packed, w.scales_f16, w.zeros, w.mins_f16, w.in, w.group, w.groups, w.asym, r, c)
                       : 0.0f;
    }
    for (int idx = tid; idx < kTileN * kTileK; idx += kGemmThreads) {
      const int tt = idx / kTileK, cc = idx % kTileK;
      const int64_t t = t0 + tt;
      xs[tt][cc] = (t < n && cc < kmax) ? x[t * w.in + k0 + cc] : 0.0f;
    }
    __syncthreads();
    for (int kk = 0; kk < kmax; ++kk) {  // column order, as the sequential reference
      const float xv = xs[tx][kk];
      for (int q = 0; q < 4; ++q) acc[q] = qe::sq_fma(xv, ws[4 * ty + q][kk], acc[q]);
    }
    __syncthreads();  // the tiles are overwritten by the next chunk
  }
  const int64_t t = t0 + tx;
  if (t >= n) return;
  for (int q = 0; q < 4; ++q) {
    const int64_t r = o0 + 4 * ty + q;
    if (r < w.out) y[t * w.out + r] = acc[q];
  }
}

class CudaW4A16Linear final : public DeviceLinear {
 public:
  CudaW4A16Linear(const Int4Weights& w, std::string format)
      : out_(w.out),
        in_(w.in),
        group_(w.group),
        groups_(int4_groups_per_row(w)),
        asym_(w.asym),
        float_min_(w.float_min()),
        format_(std::move(format)),
        packed_(w.packed.data(), w.packed.size()),
        scales_(w.scales_f16) {
    if (float_min_) mins_ = DeviceArray<uint16_t>(w.mins_f16);  // K-quant: the expanded Δ and m (quant/q4k_layout.h)
    else if (asym_) zeros_ = DeviceArray<uint8_t>(w.zeros_packed);
  }

  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  std::string format() const override { return format_; }

  void forward(const float* x, int64_t n, float* y, Stream stream) override {
    if (n < 0) throw std::invalid_argument("W4A16 device linear (" + format_ + "): negative row count " + std::to_string(n));
    if (n == 0) return;
    const Int4View v{packed_.data(), scales_.data(), asym_ && !float_min_ ? zeros_.data() : nullptr, float_min_ ? mins_.data() : nullptr,
                     out_, in_, group_, groups_, asym_};
    if (n == 1) {
      const int64_t blocks = (out_ + kGemvWarps - 1) / kGemvWarps;
      if (blocks > INT32_MAX) throw std::invalid_argument("W4A16 device linear: too many output rows");
      w4a16_gemv_kernel<<<unsigned(blocks), 32 * kGemvWarps, 0, stream_of(stream)>>>(v, x, y);
      check_launch("W4A16 device linear GEMV");
      return;
    }
    const int64_t bx = (out_ + kTileM - 1) / kTileM, by = (n + kTileN - 1) / kTileN;
    if (bx > INT32_MAX || by > 65535)
      throw std::invalid_argument("W4A16 device linear: " + std::to_string(n) + " tokens x " + std::to_string(out_) +
                                  " outputs exceed one launch (at most 65535 · 16 tokens)");
    w4a16_gemm_kernel<<<dim3(unsigned(bx), unsigned(by)), kGemmThreads, 0, stream_of(stream)>>>(v, x, n, y);
    check_launch("W4A16 device linear GEMM");
  }

 private:
  int64_t out_, in_, group_, groups_;
  bool asym_, float_min_;
  std::string format_;
  DeviceArray<uint8_t> packed_;
  DeviceArray<uint16_t> scales_;
  DeviceArray<uint8_t> zeros_;
  DeviceArray<uint16_t> mins_;
};

}  // namespace

std::unique_ptr<DeviceLinear> make_w4a16_device_linear(const Int4Weights& w, const std::string& format) {
  validate_int4(w);
  return std::make_unique<CudaW4A16Linear>(w, format);
}

}  // namespace sq::cuda
