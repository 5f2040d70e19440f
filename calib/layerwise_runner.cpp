#include "calib/layerwise_runner.h"

#include <omp.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>

#include "core/finite.h"

namespace sq {

LayerHessians::LayerHessians(const ModelConfig& c, int layer) : layer_(layer) {
  const int64_t d = c.dim, q = int64_t(c.n_heads) * c.head_dim, h = c.hidden_dim;
  for (int64_t w : {d, q, d, h}) sites_.emplace_back(w);  // ActivationSite order
}

void LayerHessians::on_linear_input(int layer, ActivationSite site, const float* x, int64_t n, int64_t width) {
  if (layer != layer_) return;
  HessianAccumulator& a = sites_[static_cast<size_t>(site)];
  if (width != a.width())
    throw std::invalid_argument(std::string("LayerHessians: ") + activation_site_name(site) + " has width " + std::to_string(width) +
                                ", expected " + std::to_string(a.width()));
  a.observe(x, n);
}

void LayerHessians::merge(const LayerHessians& other) {
  for (size_t s = 0; s < sites_.size(); ++s) sites_[s].merge(other.sites_[s]);
}

LayerwiseRunner::LayerwiseRunner(const Decoder& model, const std::vector<std::vector<int32_t>>& windows) : model_(model) {
  const ModelConfig& c = model.config();
  hidden_.reserve(windows.size());
  for (const auto& w : windows) {
    const int64_t n = static_cast<int64_t>(w.size());
    if (n > c.max_seq_len)
      throw std::length_error("calibration window of " + std::to_string(n) + " tokens exceeds the model's context of " +
                              std::to_string(c.max_seq_len));
    std::vector<float> x(static_cast<size_t>(n * c.dim));
    model.embed(w.data(), n, x.data());
    hidden_.push_back(std::move(x));
  }
}

int LayerwiseRunner::window_threads() const { return runs_windows_in_parallel(model_.config()) ? omp_get_max_threads() : 1; }

void LayerwiseRunner::run_window(int l, const DecoderLayer& L, std::vector<float>& x, ActivationObserver* obs) const {
  const ModelConfig& c = model_.config();
  const int64_t n = static_cast<int64_t>(x.size()) / c.dim;
  KVCache cache(c, std::max<int64_t>(1, n));
  Workspace ws;
  model_.forward_layer(l, L, x.data(), n, cache, ws, obs);
}

void LayerwiseRunner::advance(int l, const DecoderLayer& L) {
  const int64_t n = static_cast<int64_t>(hidden_.size());
  const int threads = window_threads();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1 && n > 1)
  for (int64_t w = 0; w < n; ++w) run_window(l, L, hidden_[static_cast<size_t>(w)], nullptr);
}

LayerHessians LayerwiseRunner::hessians(int l, const DecoderLayer& L) const {
  LayerHessians total(model_.config(), l);
  collect(l, L, total, [&] { return LayerHessians(model_.config(), l); });
  return total;
}

int64_t LayerwiseRunner::first_nonfinite_window() const {
  for (size_t w = 0; w < hidden_.size(); ++w)
    if (first_nonfinite_f32(hidden_[w].data(), static_cast<int64_t>(hidden_[w].size())) >= 0) return static_cast<int64_t>(w);
  return -1;
}

void LayerwiseRunner::observe(int l, const DecoderLayer& L, ActivationObserver& observer) const {
  for (const auto& h : hidden_) {
    std::vector<float> x = h;  // the layer's output is discarded
    run_window(l, L, x, &observer);
  }
}

int64_t LayerwiseRunner::tokens() const {
  int64_t n = 0;
  for (const auto& h : hidden_) n += static_cast<int64_t>(h.size()) / model_.config().dim;
  return n;
}

}  // namespace sq
