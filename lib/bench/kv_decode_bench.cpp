#include "bench/kv_decode_bench.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "bench/timing.h"
#include "core/error.h"
#include "core/rope_frequencies.h"
#include "model/decoder.h"
#include "ops/ops.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_decode_attention.h"

namespace sq::bench {
namespace {

ModelConfig llama7b_attention() {
  ModelConfig c;
  c.dim = 4096;
  c.hidden_dim = 11008;
  c.n_layers = 1;
  c.n_heads = 32;
  c.n_kv_heads = 32;
  c.head_dim = 128;
  c.vocab_size = 32000;
  c.max_seq_len = 1 << 20;
  c.rope_layout = RopeLayout::Interleaved;
  return c;
}

/// Fills every layer of `cache` with T rows cycling through a block of random rows (keys rotated
/// at their positions when the cache stores them after RoPE).
void fill(KVCache& cache, int64_t T, const std::vector<float>& kblock, const std::vector<float>& vblock, int64_t block,
          const ModelConfig& c) {
  const int64_t w = cache.kv_width();
  std::vector<float> k(static_cast<size_t>(block * w));
  std::vector<int32_t> pos(static_cast<size_t>(block));
  for (int64_t r = 0; r < T; r += block) {
    const int64_t n = std::min(block, T - r);
    std::copy(kblock.begin(), kblock.begin() + n * w, k.begin());
    if (!cache.keys_pre_rope()) {
      for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = static_cast<int32_t>(r + i);
      ops::rope(k.data(), pos.data(), n, c.n_kv_heads, c.head_dim, cache.rope_inv_freq(0).data(), c.rope_layout);
    }
    for (int l = 0; l < c.n_layers; ++l) cache.write(l, k.data(), vblock.data(), n);
    cache.advance(n);
  }
}

std::vector<NuqLayerParams> bench_nuq(int bits, int64_t width) {
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  NuqLayerParams p;
  for (auto* cb : {&p.key_codebook, &p.value_codebook}) {
    cb->resize(size_t(1) << bits);
    for (float& v : *cb) v = u(rng);
    std::sort(cb->begin(), cb->end());
  }
  p.key_offset.assign(static_cast<size_t>(width), 0.0f);
  p.key_scale.assign(static_cast<size_t>(width), 3.0f);
  return {p};
}

/// Layers of a cache of T rows in `spec` such that all of them together (≥ 64 MB) exceed the
/// 32 MB L3 cache twice: the timed calls cycle through the layers, so every call reads its rows
/// from DRAM, as a decode step of a real multi-layer model does.
int cold_layers(const KVSpec& spec, int64_t width, int64_t T) {
  const double layer = double(T) * double(kv_row_bytes(spec, width, 128, false) + kv_row_bytes(spec, width, 128, true));
  return std::max(1, static_cast<int>(std::ceil(64e6 / layer)));
}

}  // namespace

nlohmann::json run_kv_decode_bench(const std::vector<int64_t>& contexts, double min_seconds) {
  for (const int64_t T : contexts)
    if (T < 2) throw UsageError("--kv-contexts: contexts must be >= 2 tokens, got " + std::to_string(T));
  const ModelConfig c = llama7b_attention();
  const int64_t width = int64_t(c.n_kv_heads) * c.head_dim, qw = int64_t(c.n_heads) * c.head_dim;
  nlohmann::json out;
  out["threads"] = omp_get_max_threads();
  out["load_average_before"] = load_average();
  std::printf("== KV decode attention: 32 heads x 128, 32 KV heads, interleaved RoPE, one layer, %d threads, load average %.2f ==\n",
              omp_get_max_threads(), load_average());
#if defined(__AVX512F__)
  std::printf("fused kernel: AVX-512 path\n");
#else
  std::printf("fused kernel: scalar path (built without AVX-512)\n");
#endif
  const int64_t block = 256;
  const auto kblock = normal_vector(block * width, 31, 1.5f), vblock = normal_vector(block * width, 32, 1.0f);
  const auto q = normal_vector(qw, 33, 1.0f);
  const Decoder model(c, Tensor(), {}, Tensor(), nullptr);
  std::printf("%-7s %-13s %7s %10s %12s %10s %10s\n", "tokens", "cache", "layers", "ms/step", "MB read", "GB/s", "x fp32");
  bool first = true;
  for (const int64_t T : contexts) {
    KVCache f32(c, T);
    fill(f32, T, kblock, vblock, block, c);
    struct Nuq {
      int bits;
      std::vector<NuqLayerParams> params;
      std::unique_ptr<KVCache> cache;
      int layers;
    };
    std::vector<Nuq> nuq;
    for (int bits : {4, 3, 2}) {
      const KVSpec spec = parse_kv_spec("nuq" + std::to_string(bits));
      ModelConfig cl = c;
      cl.n_layers = cold_layers(spec, width, T);
      Nuq n{bits, {}, nullptr, cl.n_layers};
      for (int l = 0; l < cl.n_layers; ++l) n.params.push_back(bench_nuq(bits, width)[0]);
      n.cache = std::make_unique<KVCache>(cl, T, spec, &n.params);
      fill(*n.cache, T, kblock, vblock, block, cl);
      nuq.push_back(std::move(n));
    }
    std::vector<float> o(static_cast<size_t>(qw)), qr = q;
    std::vector<int32_t> qpos = {static_cast<int32_t>(T - 1)};
    ops::rope(qr.data(), qpos.data(), 1, c.n_heads, c.head_dim, rope_inv_freq(c).data(), c.rope_layout);
    Workspace ws;
    KVDecodeScratch scratch;
    std::vector<float> kbuf, vbuf;
    // The FP32 baseline must be the no-copy view (no dequantization buffer filled).
    const KVCache::View v0 = f32.read(0, T, kbuf, vbuf);
    const bool direct = kbuf.empty() && vbuf.empty();
    std::vector<TimedItem> items;
    items.push_back({"fp32", [&] {
                       const KVCache::View v = f32.read(0, T, kbuf, vbuf);
                       model.attention(qr.data(), v.keys, v.values, 1, T - 1, o.data(), ws);
                     }});
    for (Nuq& n : nuq)
      items.push_back({"nuq" + std::to_string(n.bits) + "-fused", [&, cache = n.cache.get(), layers = n.layers, l = 0]() mutable {
                         nuq_decode_attention(*cache, l, T, qr.data(), c.n_heads, o.data(), scratch);
                         l = (l + 1) % layers;
                       }});
    std::vector<float> kb2, vb2;
    if (first)
      items.push_back({"nuq4-generic", [&, l = 0]() mutable {
                         const KVCache::View v = nuq[0].cache->read(l, T, kb2, vb2);
                         l = (l + 1) % nuq[0].layers;
                         model.attention(qr.data(), v.keys, v.values, 1, T - 1, o.data(), ws);
                       }});
    (void)v0;
    time_interleaved(items, min_seconds, 3);
    const double f32_bytes = double(T) * width * 4 * 2;
    nlohmann::json jt;
    jt["fp32_direct_view"] = direct;
    for (const TimedItem& it : items) {
      double bytes = f32_bytes;
      if (it.name != "fp32") {
        const Nuq& n = nuq[it.name[3] == '4' ? 0 : it.name[3] == '3' ? 1 : 2];
        const KVCacheBytes b = n.cache->bytes();
        bytes = double(b.dense + b.sinks) / n.layers;  // one layer per step
      }
      const double ratio = items[0].best / it.best;
      const int layers = it.name == "fp32" ? 1 : nuq[it.name[3] == '4' ? 0 : it.name[3] == '3' ? 1 : 2].layers;
      std::printf("%-7lld %-13s %7d %10.3f %12.2f %10.2f %10.2f\n", static_cast<long long>(T), it.name.c_str(), layers, it.best * 1e3,
                  bytes / 1e6, bytes / it.best / 1e9, ratio);
      jt[it.name] = {{"ms", it.best * 1e3}, {"layers_cycled", layers}, {"bytes", bytes}, {"gb_per_s", bytes / it.best / 1e9}, {"fp32_over_this", ratio}};
    }
    std::printf("        fp32 view is %s; fp32/nuq4-fused = %.2f\n", direct ? "direct (no copy)" : "a COPY",
                items[0].best / items[1].best);
    if (T == 4096)
      std::printf("        acceptance (nuq4 fused no slower than FP32 at 4,096 tokens): %s\n",
                  items[1].best <= items[0].best ? "PASS" : "FAIL");
    std::string key = "T";  // (not "T" + to_string: GCC 12 -Wrestrict false positive)
    key += std::to_string(T);
    out[key] = jt;
    first = false;
  }
  out["load_average_after"] = load_average();
  std::printf("load average after: %.2f\n", load_average());
  return out;
}

}  // namespace sq::bench
