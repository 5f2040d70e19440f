#include "bench/streaming_bench.h"

#include <omp.h>

#include <cstdio>
#include <vector>

#include "bench/timing.h"
#include "eval/streaming.h"
#include "formats/mapped_file.h"
#include "formats/tokenizer.h"
#include "model/decoder.h"
#include "model/model_loader.h"

namespace sq::bench {

nlohmann::json run_streaming_bench(const StreamingBenchOptions& o) {
  LoadedModel loaded = load_model(o.model);
  auto tok = open_tokenizer_for(loaded, o.tokenizer);
  const auto ids = tok->encode(read_file_to_string(o.text), tok->default_add_bos(), false);
  const std::vector<int32_t> tokens(ids.begin(), ids.end());
  const int threads = omp_get_max_threads();
  const double load_before = load_average();

  const std::string sink_name = "sink:" + std::to_string(o.sinks) + ",window:" + std::to_string(o.window);
  const std::string recompute_name = "recompute:" + std::to_string(o.sinks + o.window);
  StreamingOptions so_sink, so_re;
  so_sink.policy = parse_kv_policy(sink_name);
  so_re.policy = parse_kv_policy(recompute_name);
  for (StreamingOptions* so : {&so_sink, &so_re}) {
    so->ctx = 0;  // one stream over the first `tokens` tokens
    so->max_tokens = o.tokens;
    so->segment = o.tokens;
  }
  StreamingResult r_sink, r_re;
  std::vector<TimedItem> items;
  items.push_back({sink_name, [&] { r_sink = evaluate_streaming(*loaded.model, tokens, so_sink); }});
  items.push_back({recompute_name, [&] { r_re = evaluate_streaming(*loaded.model, tokens, so_re); }});
  time_interleaved(items, 0.0, o.rounds);

  const double scored = static_cast<double>(r_sink.tokens_scored);
  const double tps_sink = scored / items[0].best, tps_re = scored / items[1].best, ratio = tps_sink / tps_re;
  std::printf("== streaming decode: %s, first %lld tokens of %s (%lld predictions), FP32 KV, %d threads, load average %.2f ==\n",
              o.model.c_str(), static_cast<long long>(r_sink.stream_length), o.text.c_str(),
              static_cast<long long>(r_sink.tokens_scored), threads, load_before);
  std::printf("%-22s %12s %10s %10s %14s\n", "policy", "tokens/s", "seconds", "PPL", "peak KV bytes");
  std::printf("%-22s %12.1f %10.3f %10.4f %14lld\n", sink_name.c_str(), tps_sink, items[0].best, r_sink.ppl,
              static_cast<long long>(r_sink.peak_kv_bytes));
  std::printf("%-22s %12.1f %10.3f %10.4f %14lld\n", recompute_name.c_str(), tps_re, items[1].best, r_re.ppl,
              static_cast<long long>(r_re.peak_kv_bytes));
  std::printf("StreamingLLM vs recompute: %.1fx tokens/s (target >= 10x: %s); load average after %.2f\n", ratio,
              ratio >= 10.0 ? "PASS" : "FAIL", load_average());
  auto row = [](const StreamingResult& r, double best, double tps) {
    return nlohmann::json{{"tokens_per_second", tps}, {"seconds", best}, {"ppl", r.ppl}, {"peak_kv_bytes", r.peak_kv_bytes},
                          {"peak_kv_tokens", r.peak_kv_rows}};
  };
  return {{"model", o.model},
          {"text", o.text},
          {"tokens", r_sink.stream_length},
          {"predictions", r_sink.tokens_scored},
          {"threads", threads},
          {"load_average_before", load_before},
          {"load_average_after", load_average()},
          {sink_name, row(r_sink, items[0].best, tps_sink)},
          {recompute_name, row(r_re, items[1].best, tps_re)},
          {"speedup", ratio}};
}

}  // namespace sq::bench
