// sq-bench: speed benchmarks that print ratios measured side by side in one run (docs/benchmarks.md).
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>

#include "bench/decoder_bench.h"
#include "bench/fp32_bench.h"
#include "bench/gptq_bench.h"
#include "bench/kmeans_bench.h"
#include "bench/streaming_bench.h"
#include "bench/kv_decode_bench.h"
#include "bench/real_model_bench.h"
#include "bench/w4a16_bench.h"
#include "bench/w4a4_bench.h"
#include "bench/w8a8_bench.h"
#include "bench/w8a8_model_bench.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/tool_main.h"
#include "cuda/cuda_gemm_bench.h"
#include "cuda/cuda_kv_bench.h"
#include "cuda/cuda_runtime.h"
#include "formats/atomic_file.h"
#include "formats/hf_checkpoint.h"
#include "formats/safetensors.h"
#include "model/synthetic.h"
#include "tool_cli.h"
#include "runtime/thread_governor.h"

int main(int argc, char** argv) {
  CLI::App app{"sq-bench: sqkit speed benchmarks (each result is a ratio measured in the same run).\n"
               "Suites: fp32 (sgemm at LLaMA-7B shapes vs synthetic-model prefill), w8a8-linear (INT8 linear vs sgemm), "
               "w8a8-prefill (W8A8 vs FP32 synthetic-model prefill), w4a16 (batch-1 INT4 GEMV vs FP32 sgemv), w4a4 (Atom W4A4 GEMM vs W8A8 GEMM and sgemm), "
               "kmeans (KVQuant codebook fitting: exact weighted 1-D k-means vs histogram DP vs Lloyd), "
               "gptq (GPTQ's factor of the inverse Hessian at --gptq-orders: sqkit's dpotrf + dtrtri vs the reference's dpotrf, dpotri, dpotrf "
               "vs one dgemm, one thread; not run by default), "
               "streaming (sink:4,window:252 vs recompute:256 decoding of --eval-model on --eval-text), "
               "kv-decode (decode attention, LLaMA-7B heads: FP32 cache vs fused nuq4/3/2 kernel), "
               "cuda-gemm (CUDA device: cuBLASLt INT8 GEMM, W8A8 and W4A16 linears vs cuBLAS FP16 GEMM at LLaMA-7B shapes; "
               "not in the default suites), "
               "decoder (issue 16: generic Decoder vs the pre-issue-16 LLaMA layer, prefill and decode, on --eval-model or the "
               "synthetic model; not run by default), "
               "cuda-kv-decode (CUDA decode attention, LLaMA-7B heads: nuq4 vs FP16 vs FP32 rows; needs a GPU; not run by default), "
               "real (issue 19: -m MODEL as FP32, W8A8 O1 and W4A16: llama-bench-style pp/tg, the sgemm bound of the same FLOPs, "
               "and sq-eval throughput on --eval-text; not run by default)."};
  sq::bench::RealModelBenchOptions real;
  sq::bench::Fp32BenchOptions fp32;
  std::string json_path, suites = "fp32,w8a8-linear,w8a8-prefill", eval_model, eval_tok, eval_text, synthetic_dir;
  int threads = 0, eval_ctx = 256, synthetic_layers = 0;
  std::string synthetic_shape = "1b", synthetic_dtype = "F32";
  int64_t kmeans_values = 1000000;
  std::vector<int64_t> gptq_orders = {1536, 8960};
  sq::bench::StreamingBenchOptions streaming;
  std::vector<int64_t> kv_contexts = {4096, 8192, 16384};
  std::vector<int64_t> cuda_kv_contexts = {8192, 32768};
  int cuda_kv_reps = 50;
  app.add_option("--suite", suites, "Comma-separated suites to run")->capture_default_str();
  app.add_option("--tokens", fp32.tokens, "GEMM rows / prefill length")->capture_default_str();
  app.add_option("--layers", fp32.layers, "Layers of the synthetic model")->capture_default_str();
  app.add_option("--min-seconds", fp32.min_seconds, "Minimum measuring time per item")->capture_default_str();
  app.add_option("--eval-model", eval_model, "Also measure sq-eval throughput (llamacpp protocol) on this model");
  app.add_option("--eval-tokenizer", eval_tok, "Tokenizer for --eval-model");
  app.add_option("--eval-text", eval_text, "Text for --eval-model");
  app.add_option("--eval-ctx", eval_ctx, "Context for --eval-model (real suite: 512 unless given)")->capture_default_str();
  app.add_option("--write-synthetic", synthetic_dir,
                 "Only write a synthetic LLaMA model (random weights, --synthetic-shape) as an HF checkpoint directory; "
                 "streamed, so memory stays small for any size");
  app.add_option("--synthetic-shape", synthetic_shape, "--write-synthetic shape: 1b (TinyLlama-like) or 7b (LLaMA-7B)")
      ->check(CLI::IsMember({"1b", "7b"}))
      ->capture_default_str();
  app.add_option("--synthetic-layers", synthetic_layers, "Layers for --write-synthetic (default: 16 for 1b, 32 for 7b)");
  app.add_option("--synthetic-dtype", synthetic_dtype, "Storage dtype for --write-synthetic: F32, F16 or BF16")
      ->check(CLI::IsMember({"F32", "F16", "BF16"}))
      ->capture_default_str();
  app.add_option("--kmeans-values", kmeans_values, "Weighted values per codebook fit (kmeans suite)")->capture_default_str();
  app.add_option("--gptq-orders", gptq_orders, "gptq suite: Hessian orders (linear input widths; Qwen2.5-1.5B: 1536, 8960)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--stream-tokens", streaming.tokens, "streaming suite: tokens of --eval-text to decode")->capture_default_str();
  app.add_option("--stream-sinks", streaming.sinks, "streaming suite: attention sinks S")->capture_default_str();
  app.add_option("--stream-window", streaming.window, "streaming suite: window W (recompute uses S + W)")->capture_default_str();
  app.add_option("--kv-contexts", kv_contexts, "Cached tokens for the kv-decode suite")->delimiter(',')->capture_default_str();
  app.add_option("--cuda-kv-contexts", cuda_kv_contexts, "Cached tokens for the cuda-kv-decode suite")->delimiter(',')->capture_default_str();
  app.add_option("--cuda-kv-reps", cuda_kv_reps, "Timed calls per item of the cuda-kv-decode suite (median)")->capture_default_str();
  app.add_option("-m,--model", real.model, "real suite: the FP32 model (any file sqkit opens)");
  app.add_option("-p,--n-prompt", real.prompt_tokens, "real suite: prompt tokens of the pp test (llama-bench -p)")->capture_default_str();
  app.add_option("-n,--n-gen", real.gen_tokens, "real suite: generated tokens of the tg test (llama-bench -n)")->capture_default_str();
  app.add_option("--eval-chunks", real.eval_chunks, "real suite: llamacpp chunks of --eval-text per variant (0 = all)")->capture_default_str();
  app.add_option("--group-size", real.group, "real suite: W4A16 group size")->capture_default_str();
  app.add_option("--variants", real.variants,
                 "real suite: only these quantized variants, comma-separated (fp32 always runs: it is the ratio base); default: all")
      ->delimiter(',');
  app.add_option("--sqm", real.files,
                 "real suite: also measure these converted .sqm files of -m (each a variant named by its file name), comma-separated")
      ->delimiter(',');
  sq::add_json_option(app, json_path, "All results");
  bool force = false;
  app.add_flag("--force", force, "Replace an existing --json file or --write-synthetic checkpoint");
  app.add_option("-t,--threads", threads, sq::kThreadsHelp);
  sq::add_version_flag(app, "sq-bench");
  if (const int status = sq::parse_tool_args(app, "sq-bench", argc, argv); status >= 0) return status;
  return sq::run_tool("sq-bench", [&]() {
    sq::apply_thread_option(threads, "sq-bench");
    // Outputs are checked before any benchmark runs.
    if (!json_path.empty()) sq::check_output_path("--json", json_path, force, {eval_model, eval_text, eval_tok, real.model}, true);
    if (!synthetic_dir.empty()) {
      sq::check_output_directory("--write-synthetic", synthetic_dir, force, {eval_model, eval_text, eval_tok});
      if (synthetic_layers < 0) throw sq::UsageError("--synthetic-layers must be positive, got " + std::to_string(synthetic_layers));
      const bool llama7b = synthetic_shape == "7b";
      const int layers = synthetic_layers > 0 ? synthetic_layers : llama7b ? 32 : 16;
      const sq::ModelConfig config = llama7b ? sq::synthetic_7b_config(layers) : sq::synthetic_1b_config(layers);
      std::vector<sq::GeneratedTensor> tensors = sq::synthetic_tensors(config);
      // Progress over all elements; shards of at most about 5 GB (transformers' default max_shard_size).
      int64_t total = 0;
      for (const auto& t : tensors) {
        int64_t n = 1;
        for (int64_t d : t.shape) n *= d;
        total += n;
      }
      const int64_t bytes = total * int64_t(sq::safetensors_dtype_size(synthetic_dtype));
      const int shards = int(std::min<int64_t>(int64_t(tensors.size()), std::max<int64_t>(1, (bytes + 4999999999) / 5000000000)));
      sq::ProgressBar bar("writing", total, "weights");
      int64_t done = 0;
      for (auto& t : tensors)
        t.generate = [inner = t.generate, &bar, &done](int64_t b, int64_t e, float* out) {
          inner(b, e, out);
          done += e - b;
          bar.update(done);
        };
      sq::save_hf_checkpoint_generated(config, tensors, synthetic_dir, synthetic_dtype, shards);
      bar.finish();
      std::printf("wrote synthetic %s-shaped %d-layer model (%lld parameters, %s, %d shard%s) to %s\n", synthetic_shape.c_str(),
                  layers, static_cast<long long>(config.parameter_count()), synthetic_dtype.c_str(), shards, shards == 1 ? "" : "s",
                  synthetic_dir.c_str());
      return sq::kExitOk;
    }
    if (kmeans_values < 1) throw sq::UsageError("--kmeans-values must be >= 1, got " + std::to_string(kmeans_values));
    for (const int64_t n : gptq_orders)
      if (n < 2 || n > 32768) throw sq::UsageError("--gptq-orders: each order must be in [2, 32768], got " + std::to_string(n));
    std::set<std::string> want;
    std::stringstream ss(suites);
    for (std::string s; std::getline(ss, s, ',');) {
      if (s != "fp32" && s != "w8a8-linear" && s != "w8a8-prefill" && s != "w4a16" && s != "w4a4" &&
          s != "kmeans" && s != "gptq" && s != "streaming" && s != "kv-decode" && s != "cuda-gemm" &&
          s != "cuda-kv-decode" && s != "decoder" && s != "real") throw sq::UsageError("unknown --suite '" + s + "'");
      want.insert(s);
    }
    // A CUDA suite without CUDA (or a device) fails before any other suite spends time.
    if (want.count("cuda-gemm")) sq::require_cuda("sq-bench --suite cuda-gemm");
    sq::StdoutToStderr text_to_stderr(json_path == "-");  // --json -: the tables go to stderr, the JSON alone to stdout
    nlohmann::json all;
    all["threads"] = sq::threads::max_threads();
    if (want.count("fp32")) all["fp32"] = sq::bench::run_fp32_bench(fp32);
    if (want.count("decoder")) {
      sq::bench::DecoderBenchOptions d;
      d.model = eval_model;
      d.layers = fp32.layers;
      d.tokens = fp32.tokens;
      d.min_seconds = fp32.min_seconds;
      all["decoder"] = sq::bench::run_decoder_bench(d);
    }
    if (want.count("w8a8-linear")) all["w8a8_linear"] = sq::bench::run_w8a8_linear_bench(fp32.tokens, fp32.min_seconds);
    if (want.count("w8a8-prefill")) all["w8a8_prefill"] = sq::bench::run_w8a8_prefill_bench(fp32.layers, fp32.tokens, fp32.min_seconds);
    if (want.count("w4a16")) all["w4a16"] = sq::bench::run_w4a16_bench(fp32.min_seconds);
    if (want.count("w4a4")) all["w4a4"] = sq::bench::run_w4a4_bench(fp32.tokens, fp32.min_seconds);
    if (want.count("kmeans")) all["kmeans"] = sq::bench::run_kmeans_bench(kmeans_values, fp32.min_seconds);
    if (want.count("gptq")) all["gptq"] = sq::bench::run_gptq_bench(gptq_orders, fp32.min_seconds);
    if (want.count("streaming")) {
      if (eval_model.empty() || eval_text.empty())
        throw sq::UsageError("--suite streaming needs --eval-model and --eval-text (and --eval-tokenizer for .bin models)");
      if (streaming.tokens < 2) throw sq::UsageError("--stream-tokens must be >= 2, got " + std::to_string(streaming.tokens));
      streaming.model = eval_model;
      streaming.tokenizer = eval_tok;
      streaming.text = eval_text;
      all["streaming"] = sq::bench::run_streaming_bench(streaming);
    }
    if (want.count("real")) {
      if (real.model.empty()) throw sq::UsageError("--suite real needs -m MODEL");
      if (real.eval_chunks < 0) throw sq::UsageError("--eval-chunks must be >= 0, got " + std::to_string(real.eval_chunks));
      real.text = eval_text;
      real.tokenizer = eval_tok;
      real.eval_ctx = app.count("--eval-ctx") ? eval_ctx : 512;  // llama-perplexity -c 512
      real.min_seconds = fp32.min_seconds;
      all["real"] = sq::bench::run_real_model_bench(real);
    }
    if (want.count("cuda-kv-decode")) all["cuda_kv_decode"] = sq::bench::run_cuda_kv_decode_bench(cuda_kv_contexts, cuda_kv_reps);
    if (want.count("kv-decode")) all["kv_decode"] = sq::bench::run_kv_decode_bench(kv_contexts, fp32.min_seconds);
    if (want.count("cuda-gemm")) all["cuda_gemm"] = sq::bench::run_cuda_gemm_bench(sq::bench::CudaGemmBenchOptions{});
    if (!eval_model.empty()) all["eval_speed"] = sq::bench::run_eval_speed_bench(eval_model, eval_tok, eval_text, eval_ctx);
    text_to_stderr.restore();
    if (!json_path.empty()) sq::write_json_report(json_path, all);
    return sq::kExitOk;
  });
}
