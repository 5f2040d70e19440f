// INT8 GEMM for W8A8 linear layers: C[m, n] = A[m, k] · B[n, k]ᵀ with INT32 accumulation, and the
// fused variant that applies the quantization scales to the INT32 result (SmoothQuant §3.1,
// Figure 3.1: scales may only index the outer dimensions — token i and output channel j — so the
// integer product can be rescaled after the fact):
//
//   y[i, j] = sa[i or 0] · sb[j or 0] · acc[i, j]  (+ bias[j]),   acc[i, j] = Σ_k A[i, k] · B[j, k]
//
// Layouts: A is row-major [m, k] (activations, one row per token); B is row-major [n, k] (the
// nn.Linear weight layout, [out, in]); C / y are row-major [m, n]. Values of A and B must lie in
// [−127, 127] (what int8_quantize.h produces); −128 is not supported by the VNNI path's u8 trick.
//
// Backends (all give bit-identical results, see `Int8Dequant`):
//   - Vnni: sqkit's own AVX-512-VNNI kernel. vpdpbusd multiplies u8 × s8, so activations are
//     shifted to u8 (a + 128) and the shift is undone with a per-column compensation
//     −128 · Σ_k B[j, k] precomputed when the weights are packed (it is the accumulators' initial
//     value, so it costs nothing per call). Weights are packed once into 48-column panels
//     ([k/4][48][4] bytes, k/4 rounded up to a multiple of 16 with zero weights) that the 8×48
//     register-blocked micro-kernel streams; the dequantization is fused into the kernel's store
//     (quant/int8_gemm_epilogue.h). The fastest kernel without AMX (lib/bench/w8a8_bench.h).
//   - Amx: the same packed panels multiplied with AMX-INT8 tile instructions (TDPBUSD, 16 × 16 × 64
//     per instruction; quant/int8_gemm_amx.h) for whole 16-row tiles of A, the VNNI kernel for the
//     last m mod 16 rows. Needs an AMX build and CPU and the OS's tile permission.
//   - OneDnn: oneDNN's matmul primitive (s8/u8 × s8 → s32, weights reordered once into oneDNN's
//     blocked layout, one cached primitive per row count m) followed by sqkit's dequantization pass.
//     oneDNN is exact only on CPUs with an INT8 dot-product instruction that accumulates into INT32
//     (AVX512-VNNI, AVX-VNNI, AMX-INT8): on older CPUs (AVX2 only) it uses vpmaddubsw, whose INT16
//     pair sums saturate for values near ±127 (oneDNN's "int8 computations" notes; measured here:
//     762 came out as 636), so it is not available there.
//   - Avx2: sqkit's own kernel for CPUs with AVX2 but no INT8 dot-product instruction
//     (quant/int8_gemm_avx2.h): both operands widened to INT16 and multiplied with vpmaddwd, exact;
//     3 × 4 register-blocked tiles. Weights kept as the plain copy.
//   - Reference: one int32 dot product per output (the compiler vectorizes it: vpmaddwd on AVX2),
//     outputs split over the threads; the definition the tests compare every backend with, and
//     the exact fallback of builds without AVX2 (on an AVX2-only EPYC, SmolLM2 W8A8 HellaSwag ran
//     48 tokens/s with it, 273 with Avx2).
// `Auto` picks Amx when it is available (build, CPU and OS), else Vnni when the CPU (and the build)
// has AVX-512-VNNI, else OneDnn when the CPU has AVX-VNNI or AMX-INT8, else Avx2 when the CPU (and
// the build) has AVX2, else Reference. (SmolLM2-135M W8A8 prefill, 512 tokens, one thread on a Xeon
// with AMX: 2.63× FP32 with Amx against 2.02× with Vnni; docs/benchmarks.md.)
//
// Threading: large products use all OpenMP threads (omp_get_max_threads()); products under about
// 4M multiply-adds run on the calling thread. Results never depend on the thread count (integer
// accumulation is exact; each output element's float epilogue is computed the same way).
// Limits: |acc| must fit in int32, guaranteed for k ≤ 131072 (127·127·k < 2³¹); larger k throws.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

namespace sq {

/// Which INT8 GEMM implementation runs (see file comment).
enum class Int8Backend { Auto, Vnni, Amx, OneDnn, Avx2, Reference };

/// "auto" / "vnni" / "amx" / "onednn" / "avx2" / "reference".
const char* to_string(Int8Backend b);

/// True when `b` can run here (Vnni needs an AVX-512-VNNI build and CPU, Amx that and
/// int8_amx::available() (quant/int8_gemm_amx.h), OneDnn a CPU with an INT8
/// dot-product instruction (cpu_has_int8_dot_product), Avx2 an AVX2 build and CPU; Auto and
/// Reference always).
bool int8_backend_available(Int8Backend b);

/// Whether the CPU has AVX512-VNNI, AVX-VNNI or AMX-INT8 (CPUID leaf 7), where oneDNN's INT8
/// matmul is exact.
bool cpu_has_int8_dot_product();

/// What `Int8Backend::Auto` resolves to on this machine: the backend named by the environment
/// variable SQ_INT8_BACKEND (amx, vnni, onednn, avx2, reference; unset, empty or "auto": none) —
/// e.g. to measure the kernels a CPU without AMX runs —, else Amx if available, else Vnni, else
/// OneDnn, else Avx2, else Reference (the first one available). Other backends are returned as
/// given. Throws UsageError (core/error.h) when SQ_INT8_BACKEND names an unknown or unavailable
/// backend.
Int8Backend resolve_int8_backend(Int8Backend b);

/// Largest supported reduction length k (so that every INT32 result is exact).
inline constexpr int64_t kInt8GemmMaxK = 131072;

/// Dequantization epilogue applied to the INT32 product (SmoothQuant §3.1, Eq. 3.1 inverted):
///   y[i, j] = fma(float(acc[i, j]), sa·sb, bias[j])   with sa = a_scales[a_per_row ? i : 0],
///                                                         sb = b_scales[b_per_col ? j : 0],
/// or float(acc)·(sa·sb) without bias. A null a_scales / b_scales means 1. Every backend evaluates
/// exactly this expression (single rounding of sa·sb, then one fused multiply-add), so their
/// outputs are bit-identical.
///
/// With a_group > 0 (ActQuant::PerTokenGroup; only kActGroupSize = 32 is supported) the activation
/// steps are a_scales[m, ceil(k / 32)], one per token and block of 32 input channels, and each
/// block's INT32 partial sum is rescaled before it is added (quant/int8_gemm_grouped.h):
///   acc_f = Σ_g (sequential fmas from 0) float(acc_g[i, j]) · a_scales[i, g],
///   y[i, j] = fma(acc_f, sb, bias[j]) (or acc_f · sb); a_scales must not be null, a_per_row is ignored.
struct Int8Dequant {
  const float* a_scales = nullptr;  ///< activation steps: [m] when a_per_row, [m, ceil(k/32)] with a_group, else [1]
  bool a_per_row = false;           ///< per-token (true) or per-tensor (false) activation scale
  const float* b_scales = nullptr;  ///< weight steps: [n] when b_per_col, else [1]
  bool b_per_col = false;           ///< per-output-channel (true) or per-tensor (false) weight scale
  const float* bias = nullptr;      ///< optional FP32 bias [n]
  int64_t a_group = 0;              ///< 0, or 32: activation steps per token and block of 32 inputs
};

/// The one dequantization expression every backend evaluates for output (i, j) (see Int8Dequant;
/// not for a_group > 0, whose sum is over blocks).
inline float int8_dequant_one(int32_t acc, int64_t i, int64_t j, const Int8Dequant& dq) {
  const float sa = dq.a_scales ? dq.a_scales[dq.a_per_row ? i : 0] : 1.0f;
  const float sb = dq.b_scales ? dq.b_scales[dq.b_per_col ? j : 0] : 1.0f;
  const float s = sa * sb;
  return dq.bias ? std::fma(static_cast<float>(acc), s, dq.bias[j]) : static_cast<float>(acc) * s;
}

/// Scalar reference: C[i, j] = Σ_k A[i, k] · B[j, k] in 64-bit, stored as int32.
/// A: [m, k] row-major s8; B: [n, k] row-major s8; C: [m, n] row-major s32.
/// Throws std::invalid_argument for negative sizes or k > kInt8GemmMaxK.
void int8_gemm_reference(const int8_t* A, const int8_t* B, int32_t* C, int64_t m, int64_t n, int64_t k);

/// Scalar reference of the fused GEMM: y[m, n] (FP32, row-major) = `dq` applied to A · Bᵀ (per
/// block of 32 inputs when dq.a_group > 0). Throws like `int8_gemm_reference`, and
/// std::invalid_argument for an a_group other than 0 and 32 or a grouped dq without a_scales.
void int8_gemm_dequant_reference(const int8_t* A, const int8_t* B, const Int8Dequant& dq, float* y, int64_t m, int64_t n,
                                 int64_t k);

/// INT8 weights B[n, k] prepared once for repeated products (packing / reordering is done at
/// construction, never per call). Immutable after construction; all methods are const and safe to
/// call concurrently from several threads.
class PackedInt8Weights {
 public:
  /// Packs B: [n, k] row-major s8 (values in [−127, 127]) for `backend` (Auto resolves now).
  /// Throws std::invalid_argument for n ≤ 0, k ≤ 0 or k > kInt8GemmMaxK, UnsupportedError (core/
  /// error.h) when the backend is unavailable here or oneDNN cannot build the primitive.
  PackedInt8Weights(const int8_t* B, int64_t n, int64_t k, Int8Backend backend = Int8Backend::Auto);
  ~PackedInt8Weights();
  PackedInt8Weights(PackedInt8Weights&&) noexcept;
  PackedInt8Weights& operator=(PackedInt8Weights&&) noexcept;

  int64_t n() const;  ///< rows of B (output features)
  int64_t k() const;  ///< columns of B (input features, the reduction length)
  Int8Backend backend() const;  ///< the resolved backend (never Auto)
  /// Row stride the biased-u8 fast path expects: k rounded up to a multiple of 64.
  int64_t padded_k() const;
  /// Bytes held by the packed representation (incl. padding and compensation terms).
  int64_t packed_bytes() const;
  /// Copies the weights back out as B[n, k] row-major s8 (inverse of the packing).
  void unpack(int8_t* B) const;

  /// C[m, n] (s32, row-major) = A[m, k] (s8, row-major) · Bᵀ; exact. m ≥ 0.
  void gemm_s32(const int8_t* A, int64_t m, int32_t* C) const;
  /// y[m, n] (f32, row-major) = dq(A[m, k] · Bᵀ) (see `Int8Dequant`; with dq.a_group > 0 the
  /// per-token-group product of quant/int8_gemm_grouped.h: 32-deep AMX tile products on the Amx
  /// backend, the VNNI kernel on Vnni (and AMX's row tails), the scalar definition for the others). Throws std::invalid_argument for an a_group
  /// other than 0 and 32 or a grouped dq without a_scales.
  void gemm_f32(const int8_t* A, int64_t m, const Int8Dequant& dq, float* y) const;
  /// Fast path of `gemm_f32`: A given in the biased unsigned form Au[i, j] = A[i, j] + 128 (u8),
  /// row stride `lda` ≥ k (bytes beyond k in a row are ignored), as written by
  /// `quantize_activations_u8`. With lda a multiple of 4 (e.g. padded_k()) the VNNI backend reads
  /// it in place; otherwise it is copied first. Throws std::invalid_argument when lda < k.
  void gemm_f32_biased(const uint8_t* Au, int64_t lda, int64_t m, const Int8Dequant& dq, float* y) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One-shot C[m, n] (s32) = A[m, k] · B[n, k]ᵀ (s8, row-major). Packs B on every call — use
/// PackedInt8Weights for repeated products. Throws like PackedInt8Weights' constructor.
void int8_gemm(const int8_t* A, const int8_t* B, int32_t* C, int64_t m, int64_t n, int64_t k,
               Int8Backend backend = Int8Backend::Auto);

/// One-shot fused y[m, n] (f32) = dq(A[m, k] · B[n, k]ᵀ); packs B on every call.
void int8_gemm_dequant(const int8_t* A, const int8_t* B, const Int8Dequant& dq, float* y, int64_t m, int64_t n, int64_t k,
                       Int8Backend backend = Int8Backend::Auto);

}  // namespace sq
