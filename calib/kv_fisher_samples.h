// Plain data: K/V activations of one decoder layer with their diagonal Fisher weights, as
// `sq-calibrate --fisher` records them (calib/fisher.h computes them; formats/calibration_h5.h
// stores them; docs/quantization.md, "Fisher information", defines them).
#pragma once

#include <cstdint>
#include <vector>

namespace sq {

/// T sampled calibration tokens of one layer, each a full row of K (before RoPE) and V:
///   keys_fisher[r, c] = (∂L/∂K[r, c])², values_fisher[r, c] = (∂L/∂V[r, c])²,
/// L the mean next-token NLL of the token's window (lib/model/decoder_backward.h). This is the
/// one-sample estimate of the diagonal Fisher information F_ii of KVQuant §3.3 (Eq. 2) for that
/// activation element; see calib/fisher.h for why no further averaging over windows is applied.
/// Rows are ordered by (window, position). Empty (tokens == 0) when Fisher data was not recorded.
struct KVFisherSamples {
  int64_t tokens = 0;                ///< T, rows stored
  int64_t width = 0;                 ///< n_kv_heads·head_dim, columns
  std::vector<float> keys;           ///< [T, width] K before RoPE
  std::vector<float> keys_fisher;    ///< [T, width] (∂L/∂K)²
  std::vector<float> values;         ///< [T, width] V
  std::vector<float> values_fisher;  ///< [T, width] (∂L/∂V)²
  std::vector<int32_t> positions;    ///< [T] position of the token within its window, 0 … L−2
  std::vector<int32_t> windows;      ///< [T] index of the token's calibration window, 0 … N−1
};

}  // namespace sq
