// The INT8 GEMM with per-token-group activation steps (ActQuant::PerTokenGroup; Int8Dequant::a_group
// of quant/int8_gemm.h): one step per token and per block of 32 input channels, as the activation
// side of llama.cpp's Q8_0 dot product (ggml's block_q8_0, QK8_0 = 32).
//
// Because the step changes along the reduction dimension, one INT32 accumulator per output cannot
// hold the whole product (SmoothQuant §3.1's constraint). Each block's INT32 partial sum is
// converted to FP32 and rescaled before it is added:
//
//   acc_f = 0;  for g in 0 … G−1:  acc_f = fma(float(Σ_{k ∈ block g} A[i, k] · B[j, k]), sa[i, g], acc_f)
//   y[i, j] = fma(acc_f, sb[j or 0], bias[j])   (acc_f · sb without bias)
//
// with G = ceil(k / 32) and sa: [m, G] row-major. float(block sum) is exact (|Σ| ≤ 127² · 32 < 2²⁴),
// and every backend evaluates exactly this sequence, so their outputs are bit-identical.
//
// The AVX-512-VNNI kernel (run_vnni) reads the packed panels of PackedInt8Weights (the VNNI and AMX
// backends' [kpad/4][w][4] layout) and biased u8 activations, as the per-token kernel does. The
// u8 shift is undone per block: the accumulator of block g starts at −128 · Σ_{k ∈ g} B[j, k]
// (group_compensation). Its register block is 4 rows × up to 48 columns (12 FP32 running sums and 12
// INT32 block sums in registers), against the per-token kernel's 8 rows: the FP32 conversion and
// fused multiply-add of every block, and half the reuse of each weight load, are what finer steps
// cost (sq-bench --suite w8a8-linear measures it). On the AMX backend (run_amx) each block is one
// 32-deep tile product (TDPBUSD with 32-byte A rows and 8-row B tiles), whose INT32 tiles are stored
// and rescaled in FP32 per block; its m mod 16 row tails run the VNNI kernel.
// Internal to quant/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "quant/int8_gemm.h"

namespace sq::int8_grouped {

/// Packed weights as the VNNI/AMX backends lay them out, the one definition of the panel geometry
/// (PackedInt8Weights::Impl of quant/int8_gemm.cpp reads its panels through it too).
struct Panels {
  const int8_t* data = nullptr;  ///< panel p at data + p · (kpad / 4) · nr · 4: [kpad/4][width(p)][4] s8
  int64_t n = 0, k = 0;          ///< B is [n, k]
  int64_t kpad = 0;              ///< k rounded up to 64 (zero weights beyond k)
  int64_t nr = 0;                ///< panel stride in columns (48 VNNI, 32 AMX)
  int64_t panels = 0;            ///< ceil(n / nr)
  /// Block compensation terms [panels][G][nr] int32: −128 · Σ_{k ∈ block g} B[j, k] for column
  /// j = p·nr + c (0 beyond n); null where no per-token-group product is run.
  const int32_t* group_comp = nullptr;

  /// Columns of panel p: min(nr, n − p·nr rounded up to 16).
  int64_t width(int64_t p) const { return std::min<int64_t>(nr, (n - p * nr + 15) / 16 * 16); }
  /// Store mask of panel p's last 16-column vector: the columns below n (all 16 but in the last
  /// panel when n is not a multiple of 16).
  uint16_t mask(int64_t p) const { return p == panels - 1 && n % 16 ? uint16_t((1u << (n % 16)) - 1) : uint16_t(0xFFFF); }
  /// Panel p: [kpad / 4][width(p)][4] bytes, the k-quads from ceil(k/4) on zero (AMX reads whole
  /// 64-deep chunks).
  const int8_t* panel(int64_t p) const { return data + p * (kpad / 4) * nr * 4; }
};

/// Activation groups of a k-wide row: ceil(k / kActGroupSize).
int64_t groups(int64_t k);

/// The block compensation terms of `Panels::group_comp` for the panels of w (w.group_comp is not
/// read). Returns [panels][G][nr] int32.
std::vector<int32_t> group_compensation(const Panels& w);

/// y[m, n] (FP32, row-major) from biased u8 activations Au[m, ·] (row stride lda, a multiple of 4,
/// ≥ 4·ceil(k/4); bytes beyond k are ignored) per the file comment, dq.a_scales: [m, G]. The VNNI
/// kernel; all OpenMP threads for large products, panels handed out dynamically (results do not
/// depend on the thread count). Throws UnsupportedError in a build without AVX-512-VNNI.
void run_vnni(const Panels& w, const uint8_t* Au, int64_t lda, int64_t m, const Int8Dequant& dq, float* y);

/// As run_vnni on the AMX backend's 32-column panels: whole 16-row tiles of A on AMX tiles, one
/// 32-deep TDPBUSD per activation group (int8_amx::block_grouped), the last m mod 16 rows (or all,
/// when lda < kpad) on run_vnni. Needs int8_amx::available().
void run_amx(const Panels& w, const uint8_t* Au, int64_t lda, int64_t m, const Int8Dequant& dq, float* y);

/// The scalar definition over plain weights B[n, k] (row-major s8) and biased u8 activations
/// (row stride lda ≥ k): every output on its own, the block sums in int32. Used by the backends
/// without packed panels (OneDnn, Avx2, Reference).
void run_plain_biased(const int8_t* B, int64_t n, int64_t k, const uint8_t* Au, int64_t lda, int64_t m, const Int8Dequant& dq, float* y);

/// As run_plain_biased with signed activations A[m, k] (row-major s8): the reference of the tests.
void run_plain(const int8_t* B, int64_t n, int64_t k, const int8_t* A, int64_t m, const Int8Dequant& dq, float* y);

}  // namespace sq::int8_grouped
