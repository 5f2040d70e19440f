// sq-bench: speed benchmarks that print ratios measured side by side in one run (docs/benchmarks.md).
#include <omp.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "bench/fp32_bench.h"
#include "core/tool_main.h"
#include "formats/atomic_file.h"

int main(int argc, char** argv) {
  CLI::App app{"sq-bench: sqkit speed benchmarks (results are ratios measured in the same run)."};
  sq::bench::Fp32BenchOptions fp32;
  std::string json_path, stories_model, stories_tok, stories_text;
  int threads = 0, eval_ctx = 256;
  app.add_option("--tokens", fp32.tokens, "GEMM rows / prefill length")->capture_default_str();
  app.add_option("--layers", fp32.layers, "Layers of the synthetic model")->capture_default_str();
  app.add_option("--min-seconds", fp32.min_seconds, "Minimum measuring time per item")->capture_default_str();
  app.add_option("--eval-model", stories_model, "Also measure sq-eval throughput (llamacpp protocol) on this model");
  app.add_option("--eval-tokenizer", stories_tok, "Tokenizer for --eval-model");
  app.add_option("--eval-text", stories_text, "Text for --eval-model");
  app.add_option("--eval-ctx", eval_ctx, "Context for --eval-model")->capture_default_str();
  app.add_option("--json", json_path, "Write all results as JSON");
  app.add_option("-t,--threads", threads, "Threads (default: all cores)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : sq::kExitInput;
  }
  return sq::run_tool("sq-bench", [&]() {
    if (threads > 0) omp_set_num_threads(threads);
    nlohmann::json all;
    all["fp32"] = sq::bench::run_fp32_bench(fp32);
    if (!stories_model.empty()) all["eval_speed"] = sq::bench::run_eval_speed_bench(stories_model, stories_tok, stories_text, eval_ctx);
    if (!json_path.empty()) sq::write_file_atomic(json_path, all.dump(2) + "\n");
    return sq::kExitOk;
  });
}
