#include "calib/fisher.h"

#include <omp.h>

#include <algorithm>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>

#include "calib/window_runner.h"
#include "model/decoder_backward.h"

namespace sq {

std::vector<FisherToken> select_fisher_tokens(int64_t windows, int64_t seq_len, int64_t max_tokens, uint64_t seed) {
  if (windows < 1 || seq_len < 2 || max_tokens < 1)
    throw std::invalid_argument("select_fisher_tokens: need windows ≥ 1, seq_len ≥ 2 and max_tokens ≥ 1, got " +
                                std::to_string(windows) + ", " + std::to_string(seq_len) + ", " + std::to_string(max_tokens));
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (windows > kMax || seq_len > kMax) throw std::invalid_argument("select_fisher_tokens: window index or position exceeds int32");
  const int64_t per_window = seq_len - 1;
  const int64_t candidates = windows * per_window;
  const int64_t keep = std::min(max_tokens, candidates);
  std::vector<FisherToken> out;
  out.reserve(static_cast<size_t>(keep));
  std::mt19937_64 rng(seed ^ 0x9E3779B97F4A7C15ull);
  for (int64_t i = 0; i < candidates && static_cast<int64_t>(out.size()) < keep; ++i) {
    bool take = keep == candidates;
    if (!take) {
      const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // uniform in [0, 1)
      take = static_cast<double>(candidates - i) * u < static_cast<double>(keep - static_cast<int64_t>(out.size()));
    }
    if (take) out.push_back({static_cast<int32_t>(i / per_window), static_cast<int32_t>(i % per_window)});
  }
  return out;
}

KVFisherResult collect_kv_fisher(const Decoder& model, const std::vector<std::vector<int32_t>>& windows,
                                 int64_t max_tokens, uint64_t seed, const std::function<void(int64_t, int64_t)>& progress) {
  if (windows.empty()) throw std::invalid_argument("collect_kv_fisher: no windows");
  const int64_t L = static_cast<int64_t>(windows[0].size());
  for (const auto& w : windows)
    if (static_cast<int64_t>(w.size()) != L)
      throw std::invalid_argument("collect_kv_fisher: windows differ in length (" + std::to_string(w.size()) + " vs " +
                                  std::to_string(L) + ")");
  const ModelConfig& c = model.config();
  const int64_t kvw = int64_t(c.n_kv_heads) * c.head_dim;
  const int64_t n = static_cast<int64_t>(windows.size());
  const std::vector<FisherToken> kept = select_fisher_tokens(n, L, max_tokens, seed);
  const int64_t T = static_cast<int64_t>(kept.size());

  KVFisherResult result;
  result.layers.resize(static_cast<size_t>(c.n_layers));
  for (KVFisherSamples& s : result.layers) {
    s.tokens = T;
    s.width = kvw;
    for (auto* v : {&s.keys, &s.keys_fisher, &s.values, &s.values_fisher}) v->resize(static_cast<size_t>(T * kvw));
    s.positions.resize(static_cast<size_t>(T));
    s.windows.resize(static_cast<size_t>(T));
    for (int64_t r = 0; r < T; ++r) {
      s.positions[static_cast<size_t>(r)] = kept[static_cast<size_t>(r)].position;
      s.windows[static_cast<size_t>(r)] = kept[static_cast<size_t>(r)].window;
    }
  }
  // Rows of window w are kept[first[w] … first[w+1]) (kept is sorted by window).
  std::vector<int64_t> first(static_cast<size_t>(n + 1), T);
  for (int64_t r = T - 1; r >= 0; --r) first[static_cast<size_t>(kept[static_cast<size_t>(r)].window)] = r;
  for (int64_t w = n - 1; w >= 0; --w) first[static_cast<size_t>(w)] = std::min(first[static_cast<size_t>(w)], first[static_cast<size_t>(w + 1)]);

  const DecoderKVBackward<float> backward(model);
  std::vector<double> losses(static_cast<size_t>(n));
  const int threads = runs_windows_in_parallel(c) ? omp_get_max_threads() : 1;
  for (int64_t g0 = 0; g0 < n; g0 += threads) {
    const int group = static_cast<int>(std::min<int64_t>(threads, n - g0));
#pragma omp parallel for num_threads(group) schedule(static, 1) if (group > 1)
    for (int i = 0; i < group; ++i) {
      const int64_t w = g0 + i;
      const KVGradients g = backward.gradients(windows[static_cast<size_t>(w)].data(), L);
      losses[static_cast<size_t>(w)] = g.loss;
      for (int64_t r = first[static_cast<size_t>(w)]; r < first[static_cast<size_t>(w + 1)]; ++r) {
        const int64_t src = int64_t(kept[static_cast<size_t>(r)].position) * kvw, dst = r * kvw;
        for (int l = 0; l < c.n_layers; ++l) {
          const KVLayerGradients<float>& a = g.layers[static_cast<size_t>(l)];
          KVFisherSamples& s = result.layers[static_cast<size_t>(l)];
          for (int64_t j = 0; j < kvw; ++j) {
            const size_t from = static_cast<size_t>(src + j), to = static_cast<size_t>(dst + j);
            s.keys[to] = a.keys[from];
            s.values[to] = a.values[from];
            s.keys_fisher[to] = a.d_keys[from] * a.d_keys[from];
            s.values_fisher[to] = a.d_values[from] * a.d_values[from];
          }
        }
      }
    }
    if (progress) progress(g0 + group, n);
  }
  double total = 0.0;
  for (double v : losses) total += v;  // window order
  result.mean_loss = total / static_cast<double>(n);
  return result;
}

}  // namespace sq
