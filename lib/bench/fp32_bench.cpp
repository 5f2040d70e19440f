#include "bench/fp32_bench.h"

#include <omp.h>

#include <cstdio>
#include <random>
#include <vector>

#include "bench/timing.h"
#include "eval/perplexity.h"
#include "formats/mapped_file.h"
#include "formats/tokenizer.h"
#include "model/decoder.h"
#include "model/model_loader.h"
#include "model/synthetic.h"
#include "ops/sgemm.h"

namespace sq::bench {

namespace {


/// GFLOP/s of C[m, n] = A[m, k] · B[n, k]ᵀ (the Linear layout) with ops::sgemm, the GEMM of the
/// decoder's FP32 linears (oneDNN at these sizes).
double sgemm_gflops(int m, int k, int n, double min_seconds) {
  const auto a = normal_vector(int64_t(m) * k, 1), b = normal_vector(int64_t(n) * k, 2);
  std::vector<float> c(static_cast<size_t>(m) * n);
  const Timing t = time_it([&] {
    ops::sgemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
  }, min_seconds);
  return 2.0 * m * n * k / t.best_seconds / 1e9;
}

}  // namespace

nlohmann::json run_fp32_bench(const Fp32BenchOptions& o) {
  nlohmann::json out;
  out["threads"] = omp_get_max_threads();
  std::printf("== FP32: sgemm (ops::sgemm: oneDNN) vs sqkit prefill (%d threads) ==\n", omp_get_max_threads());
  struct Shape { int k, n; const char* name; };
  const Shape shapes[] = {{4096, 4096, "q/o proj 4096->4096"}, {4096, 11008, "gate/up 4096->11008"}, {11008, 4096, "down 11008->4096"}};
  double flops_total = 0, seconds_total = 0;
  for (const Shape& s : shapes) {
    const double gf = sgemm_gflops(o.tokens, s.k, s.n, o.min_seconds);
    const double flops = 2.0 * o.tokens * s.k * s.n;
    flops_total += flops;
    seconds_total += flops / (gf * 1e9);
    std::printf("sgemm %-22s m=%d  %8.1f GFLOP/s\n", s.name, o.tokens, gf);
    out["sgemm"].push_back({{"m", o.tokens}, {"k", s.k}, {"n", s.n}, {"gflops", gf}});
  }
  const double sgemm_rate = flops_total / seconds_total / 1e9;
  std::printf("sgemm combined (7B layer mix)            %8.1f GFLOP/s\n", sgemm_rate);
  out["sgemm_combined_gflops"] = sgemm_rate;

  const ModelConfig cfg = synthetic_1b_config(o.layers);
  const Checkpoint ck = make_synthetic_checkpoint(cfg);
  const Decoder model = Decoder::from_checkpoint(ck);
  std::vector<int32_t> tokens(static_cast<size_t>(o.tokens));
  for (int i = 0; i < o.tokens; ++i) tokens[static_cast<size_t>(i)] = (i * 7919) % cfg.vocab_size;
  KVCache cache(cfg, o.tokens);
  Workspace ws;
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  const Timing t = time_it([&] {
    cache.clear();
    model.forward(tokens.data(), o.tokens, cache, ws, logits.data(), LogitsFor::LastToken);
  }, o.min_seconds);
  // Useful FLOPs: every linear 2·n·in·out, LM head on the last token, causal attention
  // (QKᵀ and PV: 2 · 2 · head_dim · n_heads · n(n+1)/2).
  const double n = o.tokens, d = cfg.dim, q = double(cfg.n_heads) * cfg.head_dim, kv = double(cfg.n_kv_heads) * cfg.head_dim;
  const double per_layer_linear = d * q + 2 * d * kv + q * d + 3 * d * cfg.hidden_dim;
  const double attn = 4.0 * cfg.head_dim * cfg.n_heads * n * (n + 1) / 2;
  const double flops = cfg.n_layers * (2 * n * per_layer_linear + attn) + 2.0 * cfg.vocab_size * d;
  const double prefill_rate = flops / t.best_seconds / 1e9;
  const double ratio = prefill_rate / sgemm_rate;
  std::printf("prefill synthetic 1B-class (%d layers, dim %d, ffn %d, %d/%d heads, vocab %d), %d tokens:\n", cfg.n_layers, cfg.dim,
              cfg.hidden_dim, cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size, o.tokens);
  std::printf("  %.3f s, %.0f tokens/s, %.1f GFLOP/s = %.1f%% of sgemm (target >= 70%%)\n", t.best_seconds, n / t.best_seconds,
              prefill_rate, 100 * ratio);
  out["prefill"] = {{"layers", cfg.n_layers}, {"tokens", o.tokens}, {"seconds", t.best_seconds},
                    {"tokens_per_second", n / t.best_seconds}, {"gflops", prefill_rate}, {"ratio_to_sgemm", ratio}};
  return out;
}

nlohmann::json run_eval_speed_bench(const std::string& model_path, const std::string& tokenizer_path, const std::string& text_path,
                                    int ctx) {
  LoadedModel loaded = load_model(model_path);
  auto tok = open_tokenizer_for(loaded, tokenizer_path);
  const auto ids = tok->encode(read_file_to_string(text_path), tok->default_add_bos(), false);
  const std::vector<int32_t> tokens(ids.begin(), ids.end());
  PerplexityOptions opt;
  opt.protocol = PplProtocol::LlamaCpp;
  opt.ctx = ctx;
  const PerplexityResult r = evaluate_perplexity(*loaded.model, tokens, opt);
  std::printf("sq-eval llamacpp -c %d on %s: PPL %.4f, %.0f tokens/s (target >= 10000)\n", ctx, text_path.c_str(), r.ppl,
              r.tokens_per_second);
  return {{"model", model_path}, {"text", text_path}, {"ctx", ctx}, {"ppl", r.ppl}, {"tokens_per_second", r.tokens_per_second}};
}

}  // namespace sq::bench
