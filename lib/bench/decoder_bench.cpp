#include "bench/decoder_bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "bench/llama_baseline.h"
#include "bench/timing.h"
#include "model/decoder.h"
#include "model/model_loader.h"
#include "model/synthetic.h"

namespace sq::bench {

nlohmann::json run_decoder_bench(const DecoderBenchOptions& o) {
  std::unique_ptr<Decoder> owned;
  LoadedModel loaded;
  const Decoder* model = nullptr;
  std::string name;
  if (o.model.empty()) {
    owned = std::make_unique<Decoder>(Decoder::from_checkpoint(make_synthetic_checkpoint(synthetic_1b_config(o.layers))));
    model = owned.get();
    name = "synthetic 1B-class, " + std::to_string(o.layers) + " layers";
  } else {
    loaded = load_model(o.model);
    model = loaded.model.get();
    name = o.model;
  }
  const ModelConfig& c = model->config();
  c.require_llama_structure("sq-bench --suite decoder");
  const int64_t n = o.tokens, steps = o.decode_steps;
  std::vector<int32_t> tokens(static_cast<size_t>(n + steps));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919 + 13) % size_t(c.vocab_size));
  KVCache cache(c, n + steps);
  Workspace ws;
  std::vector<float> logits_a(static_cast<size_t>(c.vocab_size)), logits_b(logits_a.size());

  using Forward = void (*)(const Decoder&, const int32_t*, int64_t, KVCache&, Workspace&, float*, LogitsFor);
  const Forward generic = [](const Decoder& m, const int32_t* t, int64_t k, KVCache& kc, Workspace& w, float* lg, LogitsFor f) {
    m.forward(t, k, kc, w, lg, f);
  };
  auto prefill = [&](Forward f, float* lg) {
    cache.clear();
    f(*model, tokens.data(), n, cache, ws, lg, LogitsFor::LastToken);
  };
  auto decode = [&](Forward f, float* lg) {  // after a prefill; the timed part is the steps only
    for (int64_t s = 0; s < steps; ++s) f(*model, tokens.data() + n + s, 1, cache, ws, lg, LogitsFor::LastToken);
  };
  // Same logits: the two paths run the same operations in the same order.
  prefill(generic, logits_a.data());
  decode(generic, logits_a.data());
  prefill(llama_baseline_forward, logits_b.data());
  decode(llama_baseline_forward, logits_b.data());
  float max_diff = 0.0f;
  for (size_t i = 0; i < logits_a.size(); ++i) max_diff = std::max(max_diff, std::fabs(logits_a[i] - logits_b[i]));

  std::vector<TimedItem> pre = {{"decoder prefill", [&] { prefill(generic, logits_a.data()); }},
                                {"baseline prefill", [&] { prefill(llama_baseline_forward, logits_b.data()); }}};
  time_interleaved(pre, o.min_seconds, 5);
  // Decode steps need a filled cache: each round prefills (untimed) and times the steps alone,
  // alternating the two contenders so load from other processes hits both alike; best of rounds.
  double dec_a = 1e30, dec_b = 1e30;
  const auto t_start = std::chrono::steady_clock::now();
  for (int round = 0; round < 5 || std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count() < 2 * o.min_seconds;
       ++round) {
    for (int k = 0; k < 2; ++k) {
      const Forward f = k == 0 ? generic : llama_baseline_forward;
      prefill(f, logits_a.data());
      const auto t0 = std::chrono::steady_clock::now();
      decode(f, logits_a.data());
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      (k == 0 ? dec_a : dec_b) = std::min(k == 0 ? dec_a : dec_b, s);
    }
    if (round >= 10000) break;
  }
  const double pre_a = pre[0].best, pre_b = pre[1].best;
  std::printf("== decoder: generic Decoder vs the pre-issue-16 LLaMA layer (%s, %d threads, load %.2f) ==\n", name.c_str(),
              omp_get_max_threads(), load_average());
  std::printf("prefill %lld tokens: decoder %.1f tok/s, baseline %.1f tok/s, ratio %.3f\n", static_cast<long long>(n), n / pre_a,
              n / pre_b, pre_b / pre_a);
  std::printf("decode %lld steps:   decoder %.1f tok/s, baseline %.1f tok/s, ratio %.3f\n", static_cast<long long>(steps),
              steps / dec_a, steps / dec_b, dec_b / dec_a);
  std::printf("max |logit difference| after prefill + decode: %g\n", static_cast<double>(max_diff));
  return {{"model", name},
          {"threads", omp_get_max_threads()},
          {"prefill_tokens", n},
          {"decode_steps", steps},
          {"decoder_prefill_tps", n / pre_a},
          {"baseline_prefill_tps", n / pre_b},
          {"prefill_speed_ratio", pre_b / pre_a},
          {"decoder_decode_tps", steps / dec_a},
          {"baseline_decode_tps", steps / dec_b},
          {"decode_speed_ratio", dec_b / dec_a},
          {"max_abs_logit_diff", max_diff},
          {"load_average", load_average()}};
}

}  // namespace sq::bench
