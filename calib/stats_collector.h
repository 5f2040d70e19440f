// Runs a model over calibration windows and accumulates activation statistics.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "calib/activation_stats.h"
#include "model/decoder.h"
#include "model/observer.h"

namespace sq {

/// An ActivationObserver that accumulates LayerStats for every layer of one model.
class StatsCollector final : public ActivationObserver {
 public:
  explicit StatsCollector(const ModelConfig& config);
  void on_linear_input(int layer, ActivationSite site, const float* x, int64_t n, int64_t width) override;
  void on_linear_output(int layer, Projection p, const float* y, int64_t n, int64_t width) override;
  void on_kv(int layer, const float* k_pre_rope, const float* v, int64_t n, int64_t width) override;
  /// Adds `other` (same config) into this collector.
  void merge(const StatsCollector& other);
  std::vector<LayerStats>& layers() { return layers_; }
  const std::vector<LayerStats>& layers() const { return layers_; }

 private:
  std::vector<LayerStats> layers_;
};

/// Runs `model` over each window (fresh KV cache per window, all positions) and returns the
/// accumulated statistics. Windows run in parallel in groups of the thread count; each window's
/// statistics are merged into the total in window order, so the result is bit-identical for any
/// thread count, and memory is O(threads), independent of the number of windows.
/// `progress(done, total)` is called after each group. Throws std::length_error for a window
/// longer than the model's context.
std::vector<LayerStats> collect_activation_stats(const Decoder& model, const std::vector<std::vector<int32_t>>& windows,
                                                 const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace sq
