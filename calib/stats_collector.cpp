#include "calib/stats_collector.h"

#include "calib/window_runner.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>

namespace sq {

StatsCollector::StatsCollector(const ModelConfig& c) {
  const int64_t d = c.dim, q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim, h = c.hidden_dim;
  const int64_t out_width[kProjections] = {q, kv, kv, d, h, h, d};
  layers_.resize(static_cast<size_t>(c.n_layers));
  for (LayerStats& L : layers_) {
    L.inputs = {ChannelStats(d), ChannelStats(q), ChannelStats(d), ChannelStats(h)};
    for (int p = 0; p < kProjections; ++p) L.output_absmax.emplace_back(static_cast<size_t>(out_width[p]), 0.0f);
    L.keys = ChannelStats(kv);
    L.values = ChannelStats(kv);
  }
}

void StatsCollector::on_linear_input(int layer, ActivationSite site, const float* x, int64_t n, int64_t) {
  layers_[static_cast<size_t>(layer)].inputs[static_cast<size_t>(site)].observe(x, n);
}

void StatsCollector::on_linear_output(int layer, Projection p, const float* y, int64_t n, int64_t width) {
  std::vector<float>& m = layers_[static_cast<size_t>(layer)].output_absmax[static_cast<size_t>(p)];
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < width; ++c) m[static_cast<size_t>(c)] = std::max(m[static_cast<size_t>(c)], std::fabs(y[t * width + c]));
}

void StatsCollector::on_kv(int layer, const float* k, const float* v, int64_t n, int64_t) {
  layers_[static_cast<size_t>(layer)].keys.observe(k, n);
  layers_[static_cast<size_t>(layer)].values.observe(v, n);
}

void StatsCollector::merge(const StatsCollector& o) {
  if (o.layers_.size() != layers_.size()) throw std::invalid_argument("StatsCollector::merge: layer counts differ");
  for (size_t l = 0; l < layers_.size(); ++l) {
    LayerStats& a = layers_[l];
    const LayerStats& b = o.layers_[l];
    for (size_t s = 0; s < a.inputs.size(); ++s) a.inputs[s].merge(b.inputs[s]);
    for (size_t p = 0; p < a.output_absmax.size(); ++p)
      for (size_t c = 0; c < a.output_absmax[p].size(); ++c) a.output_absmax[p][c] = std::max(a.output_absmax[p][c], b.output_absmax[p][c]);
    a.keys.merge(b.keys);
    a.values.merge(b.values);
  }
}

std::vector<LayerStats> collect_activation_stats(const Decoder& model, const std::vector<std::vector<int32_t>>& windows,
                                                 const std::function<void(int64_t, int64_t)>& progress) {
  return std::move(observe_windows<StatsCollector>(model, windows, progress).layers());
}

}  // namespace sq
