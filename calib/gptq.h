// GPTQ weight quantization (Frantar et al. 2023, "GPTQ: Accurate Post-Training Quantization for
// Generative Pre-trained Transformers", Algorithm 1) and the round-to-nearest (RTN) baseline with
// the identical quantizer.
//
// Quantizer (shared by GPTQ and RTN, after the reference's `Quantizer`, b = bits, maxq = 2^b − 1).
// For each (row, group) the parameters come from the group's weights w:
//   symmetric:  Δ = max|w| / (2^(b−1) − 1),              z = 2^(b−1)
//   asymmetric: lo = min(min w, 0), hi = max(max w, 0),   Δ = (hi − lo) / maxq,  z = round(−lo/Δ)
//   (Δ = 0, i.e. an all-zero group, uses Δ = 1: every weight then maps to code z, value 0)
//   code q = clamp(round(w/Δ) + z, 0, maxq)   (round half to even, as torch.round)
//   value ŵ = Δ · (q − z)
// Symmetric codes thus span [−2^(b−1), 2^(b−1)−1] around z; the absmax maps to ±(2^(b−1)−1), so the
// lowest code is used only for weights that GPTQ's error feedback pushes past the group's absmax.
// Δ and ŵ are FP32; codes are unsigned integers in [0, maxq]; z is an integer in [0, maxq+1]
// (z = 2^(b−1) ≤ maxq).
//
// Groups: columns [k·g, (k+1)·g) share (Δ, z) per row; group_size 0 means one group per row (per
// channel). When g does not divide `in`, the last group is shorter (in mod g columns).
//
// Clipping (Atom §5.1): with clip c < 1 the quantizer's range is shrunk before Δ is computed:
// symmetric Δ = (c · max|w|) / (2^(b−1) − 1); asymmetric lo, hi are multiplied by c. Weights beyond
// the clipped range saturate at the end codes.
//
// Scale search (`scale_search`, the "mse" observer; llama.cpp's make_qx_quants and
// llm-compressor's MSE observer are the peers): instead of the min/max rule above, each group's
// (Δ, z) minimizes the importance-weighted squared error E(Δ, z) = Σ_j a_j (w_j − ŵ_j)² over a set of
// candidates that always contains the min/max rule's own (Δ, z), so the search is never worse than
// it (a_j ≥ 0 per column: the calibration's Σx² of the linear's input channel, i.e. the diagonal of
// the Hessian XᵀX up to a constant, as llama.cpp's imatrix; uniform when none is given).
//   symmetric (full range, as GGML's Q4_0): m = the group's signed extreme (largest |w|); Δ may be
//     negative, so m can take the lone end code −2^(b−1) whatever its sign. Candidates
//     Δ = −m / t, t ∈ {2^(b−1) − 1, … + 0.1 …, 2^(b−1) + 1}   (m near code −2^(b−1); t = 2^(b−1) is Q4_0)
//     Δ = +m / t, t ∈ {2^(b−1) − 1.5, …, 2^(b−1) − 0.5}        (m near code 2^(b−1) − 1; includes absmax/7)
//     and for each, the least-squares step Σ a w q / Σ a q² of its codes q (llama.cpp's refinement).
//   asymmetric: the range [lo, hi] shrunk by p ∈ {1, 0.99, …, 0.80} (llm-compressor's grid), Δ and z
//     from the shrunk range by the min/max rule; then [lo·(1 − 0.05i), hi·(1 − 0.05k)], i, k = 0 … 5
//     (each end on its own, z = round(−lo'/Δ)), each also with the least-squares step
//     Σ a w (u − z) / Σ a (u − z)² of its codes (z fixed, kept only when > 0).
// Every candidate is evaluated with its FP16-rounded Δ when fp16_scales is set (the stored value).
// Codes are always clamp(round(w/Δ) + z): a negative Δ only flips which end of the grid is longer.
//
// Kept tail columns (Atom's mixed precision, §4.1 and the reference's GPTQ with "keeper" channels):
// with tail_columns = t > 0 the last t columns are not quantized here. They come after every other
// column (act_order permutes only the first in − t), receive the error feedback of all quantized
// columns, and are returned as their updated FP32 values in `dequantized` (codes 0, g_idx −1); the
// caller stores them at higher precision (Atom: INT8 per row, or FP32). Groups cover the first in − t
// columns only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quant/int4_quantize.h"

namespace sq {

/// Options of gptq_quantize / rtn_quantize.
struct GptqOptions {
  int bits = 4;           ///< code width b, 2..8
  int group_size = 128;   ///< columns per quantization group g ≥ 0; 0 = per channel (one group per row)
  bool symmetric = true;  ///< symmetric (z = 2^(b−1)) or asymmetric (min/max) quantizer, see the file comment
  double damp = 0.01;     ///< λ = damp · mean(diag H) added to diag H (the reference's percdamp); ≥ 0
  bool act_order = false; ///< quantize columns in order of descending diag(H) ("act-order"; GPTQ only)
  int block_size = 128;   ///< B of Algorithm 1: columns per lazy-batch block, ≥ 1 (does not change the result)
  /// Round every Δ to the nearest IEEE FP16 value before coding with it (a zero point is then
  /// computed from the rounded Δ), so a packer that stores FP16 scales reproduces ŵ exactly.
  bool fp16_scales = false;
  /// GPTQ only: compute every group's (Δ, z) up front from the weights before any error feedback
  /// (the reference's static_groups), in natural column order, so groups stay contiguous column
  /// ranges j / g even with act_order (what a group-wise packed layout needs). Without it, a group's
  /// parameters come from its error-updated weights when quantization reaches it.
  bool static_groups = false;
  /// Clipping ratio c ∈ (0, 1] of the quantizer's range (file comment; 1 = no clipping).
  float clip = 1.0f;
  /// Choose each group's (Δ, z) by the importance-weighted error search of the file comment
  /// instead of the min/max rule (requires clip = 1).
  bool scale_search = false;
  /// Per-column importance a_j ≥ 0 for scale_search ([in] doubles, e.g. the calibration's Σx² of
  /// the linear's input); null = uniform. gptq_quantize ignores it and uses diag(H) (the same
  /// quantity up to the constant 2/N). Groups whose importance is all zero use uniform weights.
  const std::vector<double>* importance = nullptr;
  /// GPTQ only, a fixed float-minimum grid (GGML's Q4_K, whose two-level scales are chosen before any
  /// error feedback): [out, n_groups] row-major Δ and m per (row, group); the quantizer then codes
  /// u = clamp(round((w − m)/Δ), 0, 2^b − 1) (u = 0 when Δ = 0) with ŵ = Δ·u + m, and the result's
  /// zeros are 0 (its dequantized holds Δ·u + m). Both or neither; needs static_groups.
  const std::vector<float>* grid_scales = nullptr;
  const std::vector<float>* grid_mins = nullptr;
  /// Trailing columns kept unquantized but error-compensated (file comment), 0 ≤ t < in (t = 0 when in = 0).
  int64_t tail_columns = 0;
  std::string name;       ///< layer/tensor name used in error messages, e.g. "model.layers.0.mlp.up_proj"
};

/// A quantized [out, in] weight matrix (nn.Linear layout) with everything a packer needs.
struct GptqResult {
  int64_t out = 0, in = 0;
  int bits = 0;
  int group_size = 0;   ///< effective g (= in − tail_columns for per-channel)
  int64_t n_groups = 0; ///< ceil((in − tail_columns) / g)
  std::vector<float> dequantized;  ///< Ŵ [out, in] row-major FP32, Ŵ[r, j] = scales[r, G] · (codes[r, j] − zeros[r, G]), G = g_idx[j]
  std::vector<uint8_t> codes;      ///< [out, in] row-major, original column order, values in [0, 2^bits − 1]
  std::vector<float> scales;       ///< Δ [out, n_groups] row-major
  std::vector<int32_t> zeros;      ///< z [out, n_groups] row-major (integers)
  /// [in]: group of each (original) column. j / g without act_order; with act_order the groups are
  /// consecutive runs of the *permuted* order (the reference with static_groups=False), so
  /// g_idx[perm[k]] = k / g.
  std::vector<int32_t> g_idx;
  std::vector<int64_t> perm;  ///< [in]: k-th quantized column (identity without act_order)
  /// Σ_r (W−Ŵ)[r,:] · H · (W−Ŵ)[r,:]ᵀ with the H given to gptq_quantize (undamped, as passed, with
  /// dead-column diagonals as passed); with H = (2/N)XᵀX this is (2/N)·‖(W−Ŵ)Xᵀ‖². 0 for rtn_quantize.
  double hessian_error = 0;
  /// The reference's `Losses.sum()`: Σ (w − ŵ)² / (2·[chol(H⁻¹)]ᵢᵢ²) over all weights (damped H; 0 for RTN).
  double obq_loss = 0;
};

/// Step 4 of gptq_quantize (Algorithm 1 line 2): H [n, n] (row-major double, symmetric, already
/// damped) is replaced in place by U, the upper Cholesky factor of H⁻¹ (H⁻¹ = UᵀU), in its upper
/// triangle (j ≥ i); the strict lower triangle is zeroed. Computed as the inverse of the Cholesky
/// factor of H in reversed order (dpotrf, dtrtri: 2n³/3 flops, half of inverting H and factoring the
/// inverse; gptq.cpp) with LAPACK (OpenBLAS) on one thread, so the bits do not depend on -t or the
/// load (ops/library_threads.h).
/// Returns "" on success, else why H is not positive definite (gptq_quantize names the linear);
/// throws std::invalid_argument when H.size() != n·n.
std::string gptq_inverse_cholesky(std::vector<double>& H, int64_t n);

/// GPTQ (Algorithm 1) of W [out, in] (row-major FP32, nn.Linear layout: y = W x) given the input
/// Hessian H [in, in] (row-major double, symmetric, e.g. HessianAccumulator::hessian()).
/// Steps, following the reference implementation (gptq.py `fasterquant`):
///  1. dead columns (H_ii == 0): H_ii := 1 and W[:, i] := 0;
///  2. act_order: columns permuted by descending diag(H) (stable; ties keep their order);
///  3. dampening H += damp · mean(diag H) · I;
///  4. U = upper Cholesky factor of H⁻¹ (gptq_inverse_cholesky, in double; Algorithm 1 line 2),
///     used in FP32 as the reference does;
///  5. for each block of block_size columns (line 3), for each column i (line 4): when i starts a
///     group, (Δ, z) per row are computed from the group's *current* weights, i.e. including every
///     error-feedback update of earlier columns (the reference reads them from W, which misses the
///     in-block updates when g < block_size; using the fully updated weights makes the result
///     independent of block_size); q = quant(w_i) (line 5), E_i = (w_i − q)/U_ii (line 6),
///     W[:, i:B] −= E_i · U[i, i:B] (line 7); after the block, W[:, B:] −= E · U[block, B:] (line 9,
///     one sgemm).
///  6. the codes are un-permuted to the original column order.
/// Throws UsageError for invalid options (bits ∉ [2, 8], group_size < 0, block_size < 1, damp < 0
/// or not finite, clip ∉ (0, 1], tail_columns ∉ [0, in), scale_search with clip < 1, an importance
/// vector not [in] long or with a negative / non-finite entry); std::invalid_argument when H.size() != in·in or out/in < 0; InputError naming
/// options.name when H has non-finite entries or is not positive definite after dampening.
/// Memory: one working copy of H (8·in² bytes) besides the caller's, plus an FP32 copy of its
/// Cholesky factor (4·in²) and a few FP32 copies of W; the error is computed from the caller's H.
GptqResult gptq_quantize(const float* W, int64_t out, int64_t in, const std::vector<double>& H, const GptqOptions& options);

/// Group-wise INT4 container (quant/int4_quantize.h layouts, FP16 scales) from a 4-bit GptqResult.
/// Symmetric: stored code = q − 8 (z = 8); asymmetric: code q with zero point z. Requires
/// r.bits == 4, group_size ∈ {32, 64, 128}, natural-order groups (g_idx[j] = j / g: no act_order or
/// static_groups) and FP16-exact scales (fp16_scales). Throws std::invalid_argument otherwise.
Int4Weights to_int4_weights(const GptqResult& r, bool symmetric);

/// Round-to-nearest with exactly GPTQ's quantizer and groups (file comment): each group's (Δ, z)
/// from the unmodified weights, codes = quant(w). options.damp, act_order and block_size are
/// ignored (groups are in natural column order, perm is the identity). hessian_error and obq_loss
/// are 0 (use hessian_weighted_error). Throws UsageError / std::invalid_argument as gptq_quantize.
GptqResult rtn_quantize(const float* W, int64_t out, int64_t in, const GptqOptions& options);

/// diag(H) of H [in, in] row-major, negative entries as 0: the scale search's importance from a
/// Hessian (gptq_quantize, and RTN given one). Throws std::invalid_argument when H.size() != in·in.
std::vector<double> hessian_diagonal(const std::vector<double>& H, int64_t in);

/// Σ_r (W−Ŵ)[r,:] · H · (W−Ŵ)[r,:]ᵀ for W, W_hat [out, in] FP32 row-major and H [in, in] row-major
/// double (accumulated in double). With H = (2/N)·XᵀX this is (2/N)·‖(W − Ŵ)Xᵀ‖²_F.
/// Throws std::invalid_argument when H.size() != in·in.
double hessian_weighted_error(const float* W, const float* W_hat, int64_t out, int64_t in, const std::vector<double>& H);

}  // namespace sq
