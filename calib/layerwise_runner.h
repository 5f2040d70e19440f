// Layer-by-layer calibration for sequential quantization (GPTQ, Frantar et al. 2023, §4 "Step 3"
// and the reference's llama.py `llama_sequential`): the hidden states of every calibration window
// are kept between decoder layers, so layer l's statistics can be taken on the inputs produced by
// the already-quantized layers 0 … l−1, and layer l's quantized replacement then produces the
// inputs of layer l+1.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "calib/hessian.h"
#include "calib/window_runner.h"
#include "model/decoder.h"

namespace sq {

/// GPTQ Hessians of the four linear-input sites of one decoder layer (a HessianAccumulator each:
/// attn_input (q/k/v), attn_output (o), ffn_input (gate/up), ffn_hidden (down)); an
/// ActivationObserver that ignores every other layer.
class LayerHessians final : public ActivationObserver {
 public:
  /// Accumulators for layer `layer` of a model with config `c` (8·width² bytes per site).
  LayerHessians(const ModelConfig& c, int layer);
  void on_linear_input(int layer, ActivationSite site, const float* x, int64_t n, int64_t width) override;
  /// The accumulator of `site`.
  const HessianAccumulator& at(ActivationSite site) const { return sites_[static_cast<size_t>(site)]; }
  HessianAccumulator& at(ActivationSite site) { return sites_[static_cast<size_t>(site)]; }
  /// Adds `other`'s sums (same config and layer). Throws std::invalid_argument on a width mismatch.
  void merge(const LayerHessians& other);

 private:
  int layer_;
  std::vector<HessianAccumulator> sites_;
};

/// Hidden states x [window tokens, dim] of every calibration window, advanced one layer at a time.
/// Memory: 4 · dim · (total window tokens) bytes (e.g. 32 MiB for 128 × 256 tokens at dim 256).
/// Small models (dim < 1024) run the windows in parallel, one per thread (many tiny parallel ops
/// per window would cost more in fork/join than they compute); large ones one window at a time
/// with parallel ops inside, as observe_windows (calib/window_runner.h).
class LayerwiseRunner {
 public:
  /// Embeds every window with `model` (which must outlive the runner). Throws std::length_error
  /// when a window is longer than the model's context, std::out_of_range for a bad token id.
  LayerwiseRunner(const Decoder& model, const std::vector<std::vector<int32_t>>& windows);

  /// Runs decoder layer `l` with weights `L` over every window (fresh KV cache per window, causal,
  /// positions 0 …) and replaces the stored hidden states by the layer's outputs (call it for
  /// l = 0, 1, … in order).
  void advance(int l, const DecoderLayer& L);

  /// Hessians of layer `l` (weights `L`) on the current hidden states, which are left unchanged.
  /// Deterministic for any thread count: per-window accumulators merged in window order.
  LayerHessians hessians(int l, const DecoderLayer& L) const;

  /// Runs layer `l` (weights `L`) over every window, each observed by a fresh collector `make()`,
  /// and merges the collectors into `total` in window order (`total.merge(c)`), so the result is
  /// deterministic for any thread count; the hidden states are left unchanged. Windows run in
  /// parallel groups as in advance(). Collector: an ActivationObserver with
  /// merge(const Collector&).
  template <typename Collector, typename Make>
  void collect(int l, const DecoderLayer& L, Collector& total, Make make) const {
    merge_windows(total, make, [&](int64_t w, Collector* c) {
      std::vector<float> x = hidden_[static_cast<size_t>(w)];  // the layer's output is discarded
      run_window(l, L, x, c);
    });
  }

  /// collect() and advance() in one pass: the layer's outputs replace the stored hidden states.
  template <typename Collector, typename Make>
  void collect_and_advance(int l, const DecoderLayer& L, Collector& total, Make make) {
    merge_windows(total, make, [&](int64_t w, Collector* c) { run_window(l, L, hidden_[static_cast<size_t>(w)], c); });
  }

  /// Index of the first window whose hidden states hold a NaN or ±Inf, or −1 when all are finite.
  int64_t first_nonfinite_window() const;

  /// Runs layer `l` (weights `L`) over every window, one window at a time in window order, with
  /// `observer` seeing its activations (e.g. to capture calibration rows); the stored hidden states
  /// are left unchanged.
  void observe(int l, const DecoderLayer& L, ActivationObserver& observer) const;

  /// Total tokens over all windows.
  int64_t tokens() const;

 private:
  /// Runs layer l on window w's hidden states in `x` (in place), observed by `obs` (may be null).
  void run_window(int l, const DecoderLayer& L, std::vector<float>& x, ActivationObserver* obs) const;
  int window_threads() const;
  /// Calls run(w, collector) for every window w with a fresh collector make(), in parallel groups
  /// of window_threads(), and merges the collectors into `total` in window order. One window at a
  /// time (large models: !runs_windows_in_parallel, calib/window_runner.h) runs with `total` itself as the collector: no
  /// per-window copy (a LLaMA-7B layer's Hessians are 1.4 GB), the same order as
  /// observe_windows (calib/window_runner.h), so a streamed run equals the whole-model one.
  template <typename Collector, typename Make, typename Run>
  void merge_windows(Collector& total, Make make, Run run) const {
    const int threads = window_threads();
    const int64_t n = static_cast<int64_t>(hidden_.size());
    if (!runs_windows_in_parallel(model_.config())) {
      for (int64_t w = 0; w < n; ++w) run(w, &total);
      return;
    }
    std::vector<std::unique_ptr<Collector>> per_window(static_cast<size_t>(threads));
    for (int64_t g0 = 0; g0 < n; g0 += threads) {
      const int group = static_cast<int>(std::min<int64_t>(threads, n - g0));
#pragma omp parallel for num_threads(group) schedule(static, 1) if (group > 1)
      for (int i = 0; i < group; ++i) {
        auto c = std::make_unique<Collector>(make());
        run(g0 + i, c.get());
        per_window[static_cast<size_t>(i)] = std::move(c);
      }
      for (int i = 0; i < group; ++i) total.merge(*per_window[static_cast<size_t>(i)]);  // window order
    }
  }

  const Decoder& model_;
  std::vector<std::vector<float>> hidden_;  ///< per window: [tokens, dim]
};

}  // namespace sq
