#include "calib/awq.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "core/error.h"

namespace sq {

std::vector<float> awq_alpha_grid() {
  std::vector<float> g;
  for (int k = 0; k < 20; ++k) g.push_back(0.05f * static_cast<float>(k));
  return g;
}

std::vector<float> awq_mapping_factors(const Checkpoint& ck, const SmoothingMapping& m, const LayerStats& stats, float alpha) {
  if (!(alpha >= 0.0f && alpha <= 1.0f)) throw UsageError("AWQ: alpha must be in [0, 1], got " + std::to_string(alpha));
  const ChannelStats& cs = stats.inputs.at(static_cast<size_t>(m.site));
  if (cs.tokens <= 0)
    throw UsageError("AWQ: the calibration statistics of layer " + std::to_string(m.layer) + " " + activation_site_name(m.site) +
                     " hold no tokens");
  const int64_t width = ck.tensors.at(m.balance.at(0) + ".weight").dim(1);
  if (static_cast<int64_t>(cs.sum_sq.size()) != width)
    throw std::invalid_argument("AWQ " + describe_mapping(m) + ": the statistics have " + std::to_string(cs.sum_sq.size()) +
                                " channels, the balance linears " + std::to_string(width) + " input columns");
  const size_t C = static_cast<size_t>(mapping_channels(ck, m));
  std::vector<double> rms(C, 0.0);
  for (size_t j = 0; j < cs.sum_sq.size(); ++j) {
    const size_t c = m.balance_channel.empty() ? j : static_cast<size_t>(m.balance_channel.at(j));
    if (c >= C) throw std::invalid_argument("AWQ " + describe_mapping(m) + ": balance_channel out of range");
    rms[c] = std::max(rms[c], std::sqrt(cs.sum_sq[j] / static_cast<double>(cs.tokens)));
  }
  std::vector<double> s(C);
  double lo = 0, hi = 0;
  for (size_t c = 0; c < C; ++c) {
    s[c] = std::pow(std::max(rms[c], 1e-4), static_cast<double>(alpha));
    lo = c == 0 ? s[c] : std::min(lo, s[c]);
    hi = c == 0 ? s[c] : std::max(hi, s[c]);
  }
  const double norm = std::sqrt(hi * lo);
  std::vector<float> out(C);
  for (size_t c = 0; c < C; ++c) out[c] = static_cast<float>(std::clamp(s[c] / norm, 1e-5, 1e5));
  return out;
}

}  // namespace sq
