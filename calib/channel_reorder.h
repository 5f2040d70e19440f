// Atom's outlier-channel reorder (Atom [Zhao et al. 2024] §4.1, §5.1 "we select channels with the
// highest square sum values as outlier channels ... then reorder activation and weight matrices"):
// which input channels of a linear are outliers, the permutation that moves them to the end, and
// how it is applied to weights and Hessians — folded exactly into the producing operator where the
// producer's output channels map 1:1 onto the consumer's input channels.
//
// Convention: an order is a permutation `order` [in] where reordered position p holds input channel
// order[p]; the normal channels come first in ascending channel index, then the n_outlier outliers
// in ascending channel index. A reordered weight is W'[:, p] = W[:, order[p]] and a reordered
// activation x'[p] = x[order[p]], so x'·W'ᵀ = x·Wᵀ exactly (the same products, summed in another
// order).
//
// Where each reorder goes (LLaMA decoder layer):
//   ffn_hidden (down_proj input = silu(gate)·up, element-wise in the hidden channels): FOLDED into
//              the rows of gate_proj and up_proj (their output channel p becomes order[p]), so the
//              hidden activation is produced already reordered and down_proj's columns are
//              permuted — exact, no run-time work;
//   attn_input, ffn_input (RMSNorm outputs of the residual stream, which every layer reads in the
//              same order) and attn_output (attention output, whose channels are tied to heads and
//              mixed by softmax per head): GATHERED at run time, fused into the activation
//              quantizer (W4A4Linear's source map).
#pragma once

#include <cstdint>
#include <vector>

#include "core/checkpoint.h"

namespace sq {

/// Default requested outlier count (Atom §5.1: 128 outlier channels).
inline constexpr int64_t kAtomDefaultOutliers = 128;
/// The automatic cap: at most in / kAtomOutlierCapDivisor outliers per linear input (1/16 of the
/// width: Atom's 128 of 4096 channels is 1/32; 128 is never capped for widths ≥ 2048).
inline constexpr int64_t kAtomOutlierCapDivisor = 16;

/// Outlier channels of a linear input of width `in`: `requested` < 0 means automatic,
/// min(kAtomDefaultOutliers, in / kAtomOutlierCapDivisor); otherwise exactly `requested`.
/// Throws UsageError when an explicit count is not below `in` (at least one INT4 channel must remain).
int64_t atom_outlier_count(int64_t in, int64_t requested);

/// The order (file comment) that puts the n_outlier channels with the largest sum of squares last.
/// sum_sq [in] per-channel Σx² from calibration (ChannelStats::sum_sq); ties go to the lower index.
/// Throws std::invalid_argument when n_outlier ∉ [0, in).
std::vector<int32_t> outlier_channel_order(const std::vector<double>& sum_sq, int64_t n_outlier);

/// W' [out, in] = W[:, order[p]] (row-major FP32). Throws std::invalid_argument on a size mismatch.
Tensor permute_columns(const Tensor& w, const std::vector<int32_t>& order);
/// W' [out, in] with rows W'[p, :] = W[order[p], :]. Throws std::invalid_argument on a size mismatch.
Tensor permute_rows(const Tensor& w, const std::vector<int32_t>& order);
/// H' [in, in] = H[order[p], order[q]] (row-major double), the Hessian of the reordered input.
std::vector<double> permute_hessian(const std::vector<double>& h, const std::vector<int32_t>& order);

/// Folds the reorder of layer `layer`'s ffn_hidden into `ck` (canonical names): rows of gate_proj
/// and up_proj permuted by `order` (and their biases, if any), columns of down_proj permuted; for a
/// plain MLP fc1 (up_proj) rows and fc2 (down_proj) columns, with experts every expert's (one
/// order for all: ffn_hidden statistics pool the experts). The
/// layer computes exactly the same function; down_proj's input then arrives reordered. Throws
/// InputError (Checkpoint::get) when a tensor is missing or mis-shaped.
void fold_ffn_hidden_order(Checkpoint& ck, int layer, const std::vector<int32_t>& order);

}  // namespace sq
