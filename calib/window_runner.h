// Runs a model over calibration windows with a per-window observer and merges the results in order.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/finite.h"
#include "model/decoder.h"
#include "model/nonfinite.h"

namespace sq {

/// A fresh collector: Collector(model) when it can be built from the Decoder (one that needs the
/// weights, as HessianCollector for mixture-of-experts layers), Collector(model.config()) otherwise.
/// Whether calibration runs a model's windows in parallel, one per thread, each observed by a fresh
/// collector merged in window order (models narrower than 1024: many tiny parallel ops per window
/// would cost more in fork/join than they compute), or one window at a time with parallel ops
/// inside, observed by the total collector itself. Decided by the model, never by the thread count,
/// so results do not depend on it; observe_windows and LayerwiseRunner must agree for a streamed
/// run to equal the whole-model one.
inline bool runs_windows_in_parallel(const ModelConfig& c) { return c.dim < 1024; }

template <typename Collector>
Collector make_collector(const Decoder& model) {
  if constexpr (std::is_constructible_v<Collector, const Decoder&>)
    return Collector(model);
  else
    return Collector(model.config());
}

/// Runs `model` over each window (fresh KV cache, all positions, no logits) with a fresh
/// collector (make_collector) as its ActivationObserver, and merges every window's collector into the
/// total in window order (`total.merge(per_window)`). Small models (dim < 1024) run windows in
/// parallel, one per thread, in groups of the thread count; large ones run one window at a time with
/// parallel ops inside, observed by `total` itself (no per-window collector: a LLaMA-7B layer's
/// Hessians are 1.4 GB). Because merging follows window order, the result is bit-identical for any
/// thread count, and memory is O(threads) collectors, independent of the number of windows.
/// `progress(done, total)` is called after each group.
/// After each window the final hidden state [n, dim] is checked for NaN / ±Inf (n·dim floats next
/// to the window's forward pass); the first window (in order) that fails is re-run layer by layer
/// and NonFiniteError "non-finite activation in layer 3 (...) in calibration window 5 of 64 (...)"
/// is thrown (model/nonfinite.h).
/// Collector: constructible from `const ModelConfig&` or `const Decoder&`, derived from ActivationObserver, with
/// `void merge(const Collector&)`.
template <typename Collector>
Collector observe_windows(const Decoder& model, const std::vector<std::vector<int32_t>>& windows,
                          const std::function<void(int64_t, int64_t)>& progress = {}) {
  const ModelConfig& c = model.config();
  const bool per_window_collectors = runs_windows_in_parallel(c);
  const int threads = per_window_collectors ? omp_get_max_threads() : 1;
  Collector total = make_collector<Collector>(model);
  std::vector<std::unique_ptr<Collector>> per_window(static_cast<size_t>(threads));
  const int64_t n = static_cast<int64_t>(windows.size());
  for (int64_t g0 = 0; g0 < n; g0 += threads) {
    const int group = static_cast<int>(std::min<int64_t>(threads, n - g0));
    std::vector<char> bad(static_cast<size_t>(group), 0);
#pragma omp parallel for num_threads(group) schedule(static, 1) if (group > 1)
    for (int i = 0; i < group; ++i) {
      const auto& w = windows[static_cast<size_t>(g0 + i)];
      // One window at a time: observed by the total directly (same window order as merging).
      std::unique_ptr<Collector> col = per_window_collectors ? std::make_unique<Collector>(make_collector<Collector>(model)) : nullptr;
      KVCache cache(c, std::max<int64_t>(1, static_cast<int64_t>(w.size())));
      Workspace ws;
      model.forward(w.data(), static_cast<int64_t>(w.size()), cache, ws, nullptr, LogitsFor::None, col ? col.get() : &total);
      bad[static_cast<size_t>(i)] = first_nonfinite_f32(ws.x.data(), static_cast<int64_t>(w.size()) * c.dim) >= 0;
      per_window[static_cast<size_t>(i)] = std::move(col);
    }
    for (int i = 0; i < group; ++i)
      if (bad[static_cast<size_t>(i)]) {  // outside the parallel region: locate, then throw
        const auto& w = windows[static_cast<size_t>(g0 + i)];
        KVCache cache(c, std::max<int64_t>(1, static_cast<int64_t>(w.size())));
        Workspace ws;
        throw nonfinite_activation_error(locate_nonfinite_activation(model, w.data(), static_cast<int64_t>(w.size()), cache, ws),
                                         "in calibration window " + std::to_string(g0 + i) + " of " + std::to_string(n));
      }
    if (per_window_collectors)
      for (int i = 0; i < group; ++i) total.merge(*per_window[static_cast<size_t>(i)]);  // window order
    if (progress) progress(g0 + group, n);
  }
  return total;
}

}  // namespace sq
