#include "bench/w8a8_model_bench.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "bench/timing.h"
#include "model/decoder.h"
#include "model/quantize_in_memory.h"
#include "model/synthetic.h"

namespace sq::bench {

nlohmann::json run_w8a8_prefill_bench(int layers, int tokens, double min_seconds) {
  const ModelConfig cfg = synthetic_1b_config(layers);
  const Checkpoint ck = make_synthetic_checkpoint(cfg);
  Decoder fp32 = Decoder::from_checkpoint(ck);
  Decoder w8a8 = Decoder::from_checkpoint(ck);
  quantize_linears_w8a8(w8a8, WeightGranularity::PerChannel, ActQuant::PerToken, /*include_head=*/true);
  std::vector<int32_t> ids(static_cast<size_t>(tokens));
  for (int i = 0; i < tokens; ++i) ids[static_cast<size_t>(i)] = (i * 7919) % cfg.vocab_size;
  KVCache cache(cfg, tokens);
  Workspace ws;
  std::vector<float> a(static_cast<size_t>(cfg.vocab_size)), b(a.size());
  auto prefill = [&](const Decoder& m, std::vector<float>& logits) {
    cache.clear();
    m.forward(ids.data(), tokens, cache, ws, logits.data(), LogitsFor::LastToken);
  };
  const Timing tf = time_it([&] { prefill(fp32, a); }, min_seconds);
  const Timing tq = time_it([&] { prefill(w8a8, b); }, min_seconds);
  float diff = 0, mag = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    mag = std::max(mag, std::fabs(a[i]));
  }
  const double speedup = tf.best_seconds / tq.best_seconds;
  std::printf("== W8A8 vs FP32 prefill: synthetic 1B-class, %d layers, %d tokens ==\n", layers, tokens);
  std::printf("FP32 %.3f s (%.0f tok/s) | W8A8 %.3f s (%.0f tok/s) | speed-up %.2fx (target >= 2.5x) | max|dlogit| %.3f of max|logit| %.2f\n",
              tf.best_seconds, tokens / tf.best_seconds, tq.best_seconds, tokens / tq.best_seconds, speedup, diff, mag);
  return {{"layers", layers},          {"tokens", tokens},          {"fp32_seconds", tf.best_seconds},
          {"w8a8_seconds", tq.best_seconds}, {"speedup", speedup}, {"max_logit_diff", diff}};
}

}  // namespace sq::bench
