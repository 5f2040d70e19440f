// FP32 products with a fixed weight matrix, y[n, out] = x[n, in] · W[out, in]ᵀ, through oneDNN's
// matmul primitive (its brgemm kernels), for the dense linears' prefill (model/linear.h).
//
// Why not ops::sgemm (dnnl_sgemm) for these: at SmolLM2-135M's prefill shapes (n = 512, 2 threads,
// AMD EPYC Zen 5) the matmul primitive runs 506–515 GFLOP/s where dnnl_sgemm runs 398–492, and with
// W reordered once into the primitive's blocked layout it keeps 506–523 GFLOP/s when W comes from
// DRAM (a model's weights, layer after layer), where dnnl_sgemm, which packs W on every call, falls
// to 393–456 (a scratch program cycling 30 matrices of each shape; docs/benchmarks.md, run D).
//
// A primitive is compiled for one shape (oneDNN's runtime-dimension variant falls back to the
// dnnl_sgemm kernels), so row counts are bounded: n rows run as a body of the largest multiple of
// kRowStep rows plus, for the remaining n mod kRowStep rows, one kRowStep-row product on zero-padded
// copies. Each distinct body costs one primitive creation (≈ 0.2–0.5 ms) the first time; up to
// kMaxShapes are kept, further ones are refused (forward returns false, the caller uses
// ops::sgemm). Before 2026-11-29 every distinct n took a primitive of its own and only 16 were kept:
// HellaSwag's batches (lib/eval/hellaswag.cpp), whose row counts vary from batch to batch, then fell
// to dnnl_sgemm, which packs W again on every call — Gemma 3's 262,144 × 640 LM head included —
// and 16 Gemma 3 tasks took 26.4 s, 16.5 s with bodies and tails (2 threads, AVX2-only machine, under load).
#pragma once

#include <cstdint>
#include <memory>

namespace sq::ops {

/// Whether a WeightMatmul outruns ops::sgemm on this CPU, i.e. whether oneDNN runs its FP32 matmul
/// primitive with the brgemm kernels (oneDNN 2.x has them for AVX-512 only; decided once per
/// process from the implementation oneDNN picks for a probe shape, 512 × 2048 → 2048, packed
/// weights). Without them the primitive is a jit sgemm reading W in the packed layout ("gemm:jit"),
/// slower than dnnl_sgemm on plain W: on a 2-core AMD EPYC with AVX2 only (2026-11-29, one thread,
/// x[n, 640] · W[262144, 640]ᵀ, Gemma 3's LM head) 10–19 GFLOP/s for n = 16…256 where dnnl_sgemm
/// ran 14–48; Gemma 3 HellaSwag, 16 tasks, 2 threads: 30.7 s with the primitive, 17.1 s without.
/// DenseLinear then uses ops::linear_sgemm for every product and keeps no packed copy.
bool weight_matmul_pays();

/// How the weight matrix is held.
enum class WeightLayout {
  Plain,   ///< the caller's W[out, in] row-major, not copied (must outlive the WeightMatmul)
  Packed,  ///< a copy reordered into the primitive's preferred blocked layout (out·in floats)
};

/// y[n, out] = x[n, in] · W[out, in]ᵀ with one weight matrix, all FP32 row-major.
/// Thread-safe: forward may run concurrently from several threads (the primitive cache is locked;
/// oneDNN primitives execute concurrently). Uses omp_get_max_threads() threads, one inside a
/// parallel region.
class WeightMatmul {
 public:
  /// Granularity of the compiled row counts (see the file comment).
  static constexpr int64_t kRowStep = 16;
  /// Compiled row counts (multiples of kRowStep) kept per matrix: every n up to 1,024 fits.
  static constexpr int kMaxShapes = 64;

  /// w: [out, in] row-major. Packed copies W now (the layout is the one oneDNN picks for
  /// `rows_hint` rows; every row count seen so far got the same layout; a multiple of kRowStep
  /// also keeps that primitive). Throws std::runtime_error
  /// naming the shape when oneDNN has no matmul for it or out/in are not positive.
  WeightMatmul(const float* w, int64_t out, int64_t in, WeightLayout layout, int64_t rows_hint = 512);
  ~WeightMatmul();
  WeightMatmul(const WeightMatmul&) = delete;
  WeightMatmul& operator=(const WeightMatmul&) = delete;

  /// y[n, out] = x[n, in] · Wᵀ (y overwritten). Returns false, computing nothing, when no primitive
  /// is available for n's body or tail (kMaxShapes row counts already compiled, or oneDNN offers
  /// none with the packed layout for that count); the caller then uses another GEMM. Row r of y
  /// depends on row r of x alone, computed by the primitive of n's body or of the tail. Throws std::runtime_error when
  /// oneDNN fails while executing.
  bool forward(const float* x, int64_t n, float* y) const;

  /// Bytes held by the packed copy (0 for Plain).
  int64_t packed_bytes() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace sq::ops
