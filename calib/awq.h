// Activation-aware weight quantization (AWQ; Lin et al., MLSys 2024, ../shared/papers README):
// the per-input-channel scaling of §3.2–3.3 before group-wise INT4 weight quantization.
//
// A linear's input channels with large activations matter most; scaling W's column j up by s_j
// (and the input down by s_j, folded into the op that produces the input) shrinks those weights'
// relative rounding error. AWQ takes s = s_X^α with s_X the average activation magnitude of each
// channel and searches α on a grid per group of linears sharing an input, minimizing the output
// error of the quantized linears on calibration activations (Eq. 5):
//   α* = argmin_α ‖ Q(W·diag(s)) (diag(s)⁻¹ X) − W X ‖²,  s = s_X^α / √(max s_X^α · min s_X^α).
// The scaling itself is SmoothQuant's transform (calib/smoothing_mappings.h: the same mappings,
// folded into norms and into v_proj / up_proj rows), so it is exact in real arithmetic and the
// file runs with no extra operation. sqkit's s_X is the channel's RMS, √(Σx²/N) from the
// calibration statistics (AWQ's reference uses mean |x|; the file records Σx², not Σ|x|), and the
// grid is AWQ's: α = 0, 0.05, …, 0.95 (α = 0 is no scaling, so the search never ends above RTN's
// error on the rows it measures).
#pragma once

#include <vector>

#include "calib/activation_stats.h"
#include "calib/smoothing_mappings.h"
#include "core/checkpoint.h"

namespace sq {

/// AWQ's α grid: 0, 0.05, …, 0.95 (20 points, its n_grid).
std::vector<float> awq_alpha_grid();

/// AWQ factors s [C] of mapping `m` (C = mapping_channels(ck, m)) for strength α ∈ [0, 1]: per
/// balance input column j, RMS_j = √(sum_sq_j / tokens) of `stats` at m.site, reduced by max onto
/// smooth channel balance_channel[j] (GQA's v → o); s_c = max(RMS_c, 1e-4)^α, divided by
/// √(max s · min s) (AWQ's normalization, so the scaling is centred on 1), clamped to [1e-5, 1e5].
/// Throws UsageError when α is outside [0, 1] or the statistics hold no tokens,
/// std::invalid_argument when their width is not the balance linears' input width.
std::vector<float> awq_mapping_factors(const Checkpoint& ck, const SmoothingMapping& m, const LayerStats& stats, float alpha);

}  // namespace sq
