// GPTQ Hessians: H = 2·XᵀX of each linear input (Frantar et al. 2023, "GPTQ: Accurate Post-Training
// Quantization for Generative Pre-trained Transformers", Sec. 3, the layer-wise objective
// argmin_Ŵ ‖WX − ŴX‖²₂, whose Hessian with respect to each weight row is H = 2XXᵀ in the paper's
// [in, tokens] layout, i.e. 2·XᵀX for sqkit's row-major X [tokens, in]).
//
// Normalization: hessian() returns the token mean H = (2/N)·XᵀX. The reference implementation
// (gptq.py `add_batch`) divides by the number of calibration *sequences* instead; any positive
// factor c is irrelevant to GPTQ: the dampening λ = damp·mean(diag H) scales with c, the Cholesky
// factor of H⁻¹ scales with c^(−1/2), so the error feedback (w−q)/[H⁻¹]ᵢᵢ^(1/2) · [H⁻¹ chol]ᵢⱼ and
// the chosen codes are unchanged (up to rounding). Only the Hessian-weighted error value scales.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/model_config.h"
#include "model/decoder.h"
#include "model/observer.h"

namespace sq {

/// Accumulates Σ 2·xᵀx over the tokens (rows) x of one linear input of width d, in double
/// precision (FP32 activations are widened per block of rows and added with cblas_dsyrk; only the
/// upper triangle is accumulated and the result is symmetrized by hessian()).
class HessianAccumulator {
 public:
  HessianAccumulator() = default;
  /// An empty accumulator for inputs of width `width` (≥ 0).
  explicit HessianAccumulator(int64_t width);

  /// Rows per FP32 block product of observe().
  static constexpr int64_t kProductRows = 512;

  /// Adds 2·XᵀX for x: [n, width] row-major FP32 (n ≥ 0): per block of kProductRows rows an FP32
  /// product (ops::ssyrk_upper), added into FP64 sums. Non-finite values are added as they are
  /// (they make the Hessian non-finite; gptq_quantize then rejects it). Memory: width² doubles
  /// (the sums) + width² floats (the block product, kept for the next call).
  void observe(const float* x, int64_t n);
  /// Adds `other`'s sums and token count. Throws std::invalid_argument when the widths differ.
  void merge(const HessianAccumulator& other);

  int64_t width() const { return width_; }
  /// Number of observed tokens N (rows passed to observe, summed over merges).
  int64_t tokens() const { return tokens_; }
  /// The mean-normalized, symmetric H = (2/N)·XᵀX: [width, width] row-major double (see the file
  /// comment for why the normalization does not matter to GPTQ). Throws std::logic_error when no
  /// token has been observed.
  std::vector<double> hessian() const;
  /// hessian() without a second width² buffer: the sums become H in place and are moved out; the
  /// accumulator is left empty (width 0, no tokens). Bit-identical to hessian(). Throws
  /// std::logic_error when no token has been observed.
  std::vector<double> take_hessian();

 private:
  int64_t width_ = 0;
  int64_t tokens_ = 0;
  std::vector<double> sum_;  ///< upper triangle of Σ 2·xᵀx, [width, width] row-major
  std::vector<float> block_;  ///< scratch of observe(): one block's FP32 2·XᵀX (upper triangle)
};

/// An ActivationObserver collecting one HessianAccumulator per (layer, ActivationSite), for the
/// same four sites as StatsCollector: AttnInput (shared by q/k/v_proj, width dim), AttnOutput
/// (o_proj, n_heads·head_dim), FfnInput (shared by gate/up_proj, dim), FfnHidden (down_proj,
/// hidden_dim). Memory: 8·width² bytes per site and layer.
///
/// Every DecoderSpec has these four sites: a plain MLP's fc1 reads FfnInput (no gate_proj) and its
/// fc2 reads FfnHidden. Mixture of experts (spec.n_experts > 0): FfnInput is the input of every
/// expert's gate/up_proj and of the router, so its Hessian (over all tokens) is the one Hessian
/// of all of them. Each expert's down_proj reads only the tokens routed to it, and the Decoder
/// shows no observer those per-expert rows; a collector built from the Decoder
/// (HessianCollector(model)) therefore recomputes them from the FfnInput rows — the same router,
/// softmax and stable top-k as Decoder::run_experts (bit-identical selection), then
/// act(gate) ⊙ up of each selected expert — and accumulates them into FfnHidden: one pooled
/// Hessian for all experts' down_proj, 2/M·Σ hhᵀ over the M = experts_per_token·N (token,
/// selected expert) pairs, unweighted by the routing weights. Per-expert Hessians are not stored
/// (the calibration file holds one Hessian per site). A collector built from the config alone
/// leaves FfnHidden of expert layers empty.
class HessianCollector final : public ActivationObserver {
 public:
  explicit HessianCollector(const ModelConfig& config);
  /// As above, and observes expert layers' down_proj inputs from `model` (which must outlive it).
  explicit HessianCollector(const Decoder& model);
  void on_linear_input(int layer, ActivationSite site, const float* x, int64_t n, int64_t width) override;
  /// Adds `other` (same config) into this collector. Throws std::invalid_argument on a mismatch.
  void merge(const HessianCollector& other);
  /// The accumulator of `site` in `layer`. Throws std::out_of_range for a bad layer.
  const HessianAccumulator& at(int layer, ActivationSite site) const;
  HessianAccumulator& at(int layer, ActivationSite site);
  int n_layers() const { return static_cast<int>(sites_.size() / kActivationSites); }

 private:
  /// Adds the down_proj input rows of every selected expert of layer `layer` for FfnInput rows
  /// h [n, dim] to the FfnHidden accumulator (see the class comment).
  void observe_expert_hidden(int layer, const float* h, int64_t n);

  std::vector<HessianAccumulator> sites_;  ///< [layer * kActivationSites + site]
  const Decoder* model_ = nullptr;         ///< set by HessianCollector(model): expert layers
};

/// Runs `model` over each window (fresh KV cache per window, all positions) and returns the
/// accumulated Hessians (HessianCollector(model): expert layers' FfnHidden included). As collect_activation_stats: small models (dim < 1024) run windows in
/// parallel groups and merge them in window order, so the result does not depend on the thread
/// count. `progress(done, total)` is called after each group. Throws std::length_error for a
/// window longer than the model's context.
HessianCollector collect_hessians(const Decoder& model, const std::vector<std::vector<int32_t>>& windows,
                                  const std::function<void(int64_t, int64_t)>& progress = {});

/// In place: H [n, n] (row-major double, symmetric) of a linear's input x becomes the Hessian of
/// the input x' = R·(x ⊘ s) that the same linear reads once smoothed and rotated, i.e.
///   H' = R·D⁻¹·H·D⁻¹·R,   D = diag(smoothing),
/// where smoothing [n] holds the SmoothQuant factors the activations were divided by (empty: none;
/// SmoothQuant Eq. 4 — the weights become W·D) and R is the block-diagonal normalized Walsh–Hadamard
/// matrix of ops/hadamard.h with `rotation_block` (0: none; QuaRot §3 — the weights become W·D·R,
/// R symmetric and orthogonal). GPTQ on W·D·R with H' then minimizes the same output error on the
/// calibration tokens as GPTQ on the linear's real input (calib/recipe_w8a8.cpp). O(n²·log block)
/// in double. Throws std::invalid_argument when H.size() != n·n, smoothing is neither empty nor
/// [n] long, or the block is not a power of two dividing n.
void transform_hessian(std::vector<double>& H, int64_t n, const std::vector<float>& smoothing, int64_t rotation_block);

}  // namespace sq
