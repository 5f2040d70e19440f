#include "calib/stats_collector.h"

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

std::vector<LayerStats> collect_activation_stats(const LlamaModel& model, const std::vector<std::vector<int32_t>>& windows,
                                                 const std::function<void(int64_t, int64_t)>& progress) {
  const ModelConfig& c = model.config();
  // Small models: one window per thread; large models: one window at a time, parallel ops inside.
  const int threads = c.dim < 1024 ? omp_get_max_threads() : 1;
  StatsCollector total(c);
  std::vector<std::unique_ptr<StatsCollector>> per_window(static_cast<size_t>(threads));
  const int64_t n = static_cast<int64_t>(windows.size());
  for (int64_t g0 = 0; g0 < n; g0 += threads) {
    const int group = static_cast<int>(std::min<int64_t>(threads, n - g0));
#pragma omp parallel for num_threads(group) schedule(static, 1) if (group > 1)
    for (int i = 0; i < group; ++i) {
      const auto& w = windows[static_cast<size_t>(g0 + i)];
      auto col = std::make_unique<StatsCollector>(c);
      KVCache cache(c, std::max<int64_t>(1, static_cast<int64_t>(w.size())));
      Workspace ws;
      model.forward(w.data(), static_cast<int64_t>(w.size()), cache, ws, nullptr, LogitsFor::None, col.get());
      per_window[static_cast<size_t>(i)] = std::move(col);
    }
    for (int i = 0; i < group; ++i) total.merge(*per_window[static_cast<size_t>(i)]);  // window order
    if (progress) progress(g0 + group, n);
  }
  return std::move(total.layers());
}

}  // namespace sq
