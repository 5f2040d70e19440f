#include "calib/activation_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace sq {

ChannelStats::ChannelStats(int64_t c)
    : channels(c),
      absmax(static_cast<size_t>(c), 0.0f),
      min(static_cast<size_t>(c), std::numeric_limits<float>::infinity()),
      max(static_cast<size_t>(c), -std::numeric_limits<float>::infinity()),
      sum_sq(static_cast<size_t>(c), 0.0),
      token_absmax_hist(kHistBins, 0) {}

namespace {
int hist_bin(float v) {
  if (!(v > 0.0f)) return 0;
  const double b = (std::log2(static_cast<double>(v)) - ChannelStats::kHistMinExp) * ChannelStats::kHistBinsPerOctave;
  if (b < 0) return 0;
  if (b >= ChannelStats::kHistBins) return ChannelStats::kHistBins - 1;
  return static_cast<int>(b);
}
}  // namespace

void ChannelStats::observe(const float* x, int64_t n) {
  for (int64_t t = 0; t < n; ++t) {
    const float* row = x + t * channels;
    float token_max = 0.0f;
    for (int64_t c = 0; c < channels; ++c) {
      const float v = row[c], a = std::fabs(v);
      absmax[c] = std::max(absmax[c], a);
      min[c] = std::min(min[c], v);
      max[c] = std::max(max[c], v);
      sum_sq[c] += static_cast<double>(v) * v;
      token_max = std::max(token_max, a);
    }
    tensor_absmax = std::max(tensor_absmax, token_max);
    ++token_absmax_hist[static_cast<size_t>(hist_bin(token_max))];
  }
  tokens += n;
}

void ChannelStats::merge(const ChannelStats& o) {
  if (o.channels != channels) throw std::invalid_argument("ChannelStats::merge: channel counts differ");
  for (int64_t c = 0; c < channels; ++c) {
    absmax[c] = std::max(absmax[c], o.absmax[c]);
    min[c] = std::min(min[c], o.min[c]);
    max[c] = std::max(max[c], o.max[c]);
    sum_sq[c] += o.sum_sq[c];
  }
  for (size_t b = 0; b < token_absmax_hist.size(); ++b) token_absmax_hist[b] += o.token_absmax_hist[b];
  tensor_absmax = std::max(tensor_absmax, o.tensor_absmax);
  tokens += o.tokens;
}

std::vector<float> ChannelStats::token_absmax_percentiles() const {
  std::vector<float> out;
  for (double p : kTokenAbsmaxPercentiles) {
    if (p >= 100.0 || tokens == 0) {
      out.push_back(tensor_absmax);
      continue;
    }
    const double target = p / 100.0 * static_cast<double>(tokens);
    double cum = 0;
    int bin = kHistBins - 1;
    for (int b = 0; b < kHistBins; ++b) {
      cum += static_cast<double>(token_absmax_hist[static_cast<size_t>(b)]);
      if (cum >= target) {
        bin = b;
        break;
      }
    }
    const float upper = static_cast<float>(std::exp2(kHistMinExp + static_cast<double>(bin + 1) / kHistBinsPerOctave));
    out.push_back(std::min(upper, tensor_absmax));
  }
  return out;
}

}  // namespace sq
