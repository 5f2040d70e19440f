#include "bench/real_model_bench.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "bench/timing.h"
#include "core/error.h"
#include "eval/perplexity.h"
#include "formats/mapped_file.h"
#include "formats/tokenizer.h"
#include "model/decoder.h"
#include "model/model_loader.h"
#include "model/quantize_in_memory.h"
#include "ops/sgemm.h"
#include "ops/weight_matmul.h"

namespace sq::bench {

namespace {

struct Variant {
  std::string name;
  std::string description;
  std::unique_ptr<Decoder> model;
  double pp_seconds = 0, tg_seconds = 0;
  double eval_tps = 0, eval_ppl = 0;
};

/// Best-of times (seconds) of C[m, n] = A[m, k]·Wᵀ, W [n, k] (the Linear layout), with each FP32
/// GEMM sqkit has, operands hot in cache (the same matrices every call).
struct GemmTimes {
  double sgemm = 0;          ///< ops::sgemm (oneDNN's dnnl_sgemm at these sizes) on the plain matrices
  double matmul_plain = 0;   ///< oneDNN's matmul primitive on the plain matrices (ops::WeightMatmul, Plain)
  double matmul_packed = 0;  ///< the same with W reordered to its blocked layout (what DenseLinear runs)
};

GemmTimes gemm_times(int m, int k, int n, double min_seconds) {
  const auto a = normal_vector(int64_t(m) * k, 1), b = normal_vector(int64_t(n) * k, 2);
  std::vector<float> c(static_cast<size_t>(m) * n);
  const ops::WeightMatmul plain(b.data(), n, k, ops::WeightLayout::Plain, m), packed(b.data(), n, k, ops::WeightLayout::Packed, m);
  GemmTimes t;
  t.sgemm = time_it([&] { ops::sgemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n); }, min_seconds / 3)
                .best_seconds;
  t.matmul_plain = time_it([&] { plain.forward(a.data(), m, c.data()); }, min_seconds / 3).best_seconds;
  t.matmul_packed = time_it([&] { packed.forward(a.data(), m, c.data()); }, min_seconds / 3).best_seconds;
  return t;
}

struct SgemmBound {
  double sgemm_gflops = 0;   ///< ops::sgemm (dnnl_sgemm) over the model's linear shapes (FLOP-weighted): the bound's rate
  double best_gflops = 0;    ///< the faster of ops::sgemm and oneDNN matmul per shape, plain matrices: the strict bound's rate
  double plain_gflops = 0;   ///< oneDNN matmul on the plain matrices alone
  double packed_gflops = 0;  ///< oneDNN matmul on packed weights, hot (for reference; what DenseLinear runs)
  double flops = 0;          ///< FLOPs of one prefill: linears + causal attention + LM head (last row)
  double attention_flops = 0, head_flops = 0;  ///< the last two terms
  double seconds = 0;        ///< flops at sgemm_gflops
  double strict_seconds = 0; ///< flops at best_gflops
};

/// The sgemm bound of one prefill of `n` tokens (see the header): the prefill's FLOPs (2·n·in·out
/// per linear, 2·2·head_dim·n(n+1)/2 per head and layer for causal QKᵀ and PV, 2·dim·vocab for the
/// last row's LM head) at the FP32 GEMM rate measured, operands hot, at every distinct linear
/// shape of the model (C[n, out] = A[n, in]·Wᵀ, weighted by how often the shape occurs): ops::sgemm's
/// rate, and, strict, the faster of ops::sgemm and oneDNN's matmul primitive per shape.
SgemmBound sgemm_bound(const Decoder& model, int n, double min_seconds) {
  std::map<std::pair<int64_t, int64_t>, int> shapes;  // (in, out) -> count
  for (const DecoderLayer& L : model.layers())
    for (const auto* lin : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj})
      if (*lin) ++shapes[{(*lin)->in_features(), (*lin)->out_features()}];
  double best = 0, sgemm = 0, plain = 0, packed = 0, linear_flops = 0;
  for (const auto& [s, count] : shapes) {
    const GemmTimes t = gemm_times(n, int(s.first), int(s.second), min_seconds / double(shapes.size()));
    best += count * std::min(t.sgemm, t.matmul_plain);
    sgemm += count * t.sgemm;
    plain += count * t.matmul_plain;
    packed += count * t.matmul_packed;
    linear_flops += count * 2.0 * n * double(s.first) * double(s.second);
  }
  const ModelConfig& c = model.config();
  const double attention = double(c.n_heads) * c.n_layers * 2 * 2.0 * c.head_dim * double(n) * (n + 1) / 2;
  const double head = 2.0 * double(model.lm_head().in_features()) * double(model.lm_head().out_features());
  SgemmBound b;
  b.sgemm_gflops = linear_flops / sgemm / 1e9;
  b.best_gflops = linear_flops / best / 1e9;
  b.plain_gflops = linear_flops / plain / 1e9;
  b.packed_gflops = linear_flops / packed / 1e9;
  b.flops = linear_flops + attention + head;
  b.attention_flops = attention;
  b.head_flops = head;
  b.seconds = b.flops / (b.sgemm_gflops * 1e9);
  b.strict_seconds = b.flops / (b.best_gflops * 1e9);
  return b;
}

/// Best-of seconds of the FP32 model's own linears for one prefill of n rows, run alone in layer
/// order (q, k, v, o, gate, up, down of every layer, each on an [n, in] input): the prefill's GEMM
/// work with each weight matrix read from memory as the prefill reads it, without attention and
/// the elementwise passes.
double model_linears_seconds(const Decoder& model, int n, double min_seconds) {
  std::vector<const Linear*> lins;
  int64_t wide = 0;
  for (const DecoderLayer& L : model.layers())
    for (const auto* lin : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj})
      if (*lin) {
        lins.push_back(lin->get());
        wide = std::max({wide, (*lin)->in_features(), (*lin)->out_features()});
      }
  const auto x = normal_vector(int64_t(n) * wide, 3);
  std::vector<float> y(static_cast<size_t>(int64_t(n) * wide));
  return time_it([&] {
           for (const Linear* lin : lins) lin->forward(x.data(), n, y.data());
         }, min_seconds)
      .best_seconds;
}

}  // namespace

nlohmann::json run_real_model_bench(const RealModelBenchOptions& o) {
  if (o.prompt_tokens < 1 || o.gen_tokens < 1 || o.eval_ctx < 2)
    throw UsageError("sq-bench --suite real: -p/--n-prompt and -n/--n-gen must be >= 1 and --eval-ctx >= 2");
  LoadedModel loaded = load_model(o.model);
  const ModelConfig& c = loaded.model->config();
  // The eval text's tokenizer, opened while `loaded` still holds its model (it checks the vocabulary).
  std::unique_ptr<Tokenizer> tok = o.text.empty() ? nullptr : open_tokenizer_for(loaded, o.tokenizer);
  std::vector<Variant> v;
  std::vector<std::string> known;
  auto add = [&](std::string name, std::string what, auto quantize) {
    known.push_back(name);
    if (!o.variants.empty() && std::find(o.variants.begin(), o.variants.end(), name) == o.variants.end()) return;
    LoadedModel copy = load_model(o.model);
    quantize(*copy.model);
    v.push_back({std::move(name), std::move(what), std::move(copy.model)});
  };
  v.push_back({"fp32", "FP32 (as loaded)", std::move(loaded.model)});
  add("w8a8-o1-head", "W8A8 O1 (per-tensor W, per-token A), head W8A8",
      [](Decoder& m) { quantize_linears_w8a8(m, WeightGranularity::PerTensor, ActQuant::PerToken, true); });
  const std::string g = std::to_string(o.group);
  add("w4a16-g" + g, "W4A16 g" + g + " sym, head FP32", [&](Decoder& m) { quantize_linears_w4a16(m, o.group, false, false); });
  add("w4a16-g" + g + "-head", "W4A16 g" + g + " sym, head W4A16 g" + g,
      [&](Decoder& m) { quantize_linears_w4a16(m, o.group, false, true); });
  if (w4_int8_decode_supported())
    add("w4a16-g" + g + "-head-a8", "W4A16 g" + g + " sym, head W4A16, INT8 decode activations",
        [&](Decoder& m) {
          quantize_linears_w4a16(m, o.group, false, true);
          set_w4a16_decode_activations(m, W4DecodeActivations::Int8);
        });
  for (const std::string& path : o.files) {
    std::string name = std::filesystem::path(path).filename().string();
    if (name.ends_with(".sqm")) name.resize(name.size() - 4);
    LoadedModel f = load_model(path);
    if (f.model->config().vocab_size != c.vocab_size || f.model->config().n_layers != c.n_layers)
      throw UsageError("--sqm " + path + ": not a conversion of " + o.model + " (its vocabulary or layer count differs)");
    v.push_back({name, "file " + path, std::move(f.model)});
  }
  for (const std::string& name : o.variants)
    if (name != "fp32" && std::find(known.begin(), known.end(), name) == known.end()) {
      std::string list = "fp32";
      for (const std::string& k : known) list += ", " + k;
      throw UsageError("--variants: unknown variant '" + name + "' (expected some of: " + list + ")");
    }

  const int64_t np = o.prompt_tokens, ng = o.gen_tokens;
  std::vector<int32_t> tokens(static_cast<size_t>(std::max(np, ng)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919 + 13) % size_t(c.vocab_size));
  KVCache cache(c, std::max(np, ng));
  Workspace ws;
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  std::vector<TimedItem> pp, tg;
  for (Variant& x : v) {
    const Decoder* m = x.model.get();
    pp.push_back({x.name, [&, m] {
                    cache.clear();
                    m->forward(tokens.data(), np, cache, ws, logits.data(), LogitsFor::LastToken);
                  }});
    tg.push_back({x.name, [&, m] {
                    cache.clear();
                    for (int64_t s = 0; s < ng; ++s) m->forward(tokens.data() + s, 1, cache, ws, logits.data(), LogitsFor::LastToken);
                  }});
  }
  std::printf("== real model: %s (%d layers, dim %d, ffn %d, %d/%d heads, vocab %d), %d threads, load %.2f ==\n", o.model.c_str(),
              c.n_layers, c.dim, c.hidden_dim, c.n_heads, c.n_kv_heads, c.vocab_size, omp_get_max_threads(), load_average());
  std::fflush(stdout);
  time_interleaved(pp, o.min_seconds, 5);
  time_interleaved(tg, o.min_seconds, 5);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i].pp_seconds = pp[i].best;
    v[i].tg_seconds = tg[i].best;
  }
  const SgemmBound bound = sgemm_bound(*v[0].model, int(np), o.min_seconds);
  const double linears_seconds = model_linears_seconds(*v[0].model, int(np), o.min_seconds);

  if (tok) {
    const auto ids = tok->encode(read_file_to_string(o.text), tok->default_add_bos(), false);
    const std::vector<int32_t> text_tokens(ids.begin(), ids.end());
    PerplexityOptions opt;
    opt.protocol = PplProtocol::LlamaCpp;
    opt.ctx = o.eval_ctx;
    opt.max_chunks = o.eval_chunks;
    opt.replace_first_with_bos = tok->default_add_bos();
    for (Variant& x : v) {
      const PerplexityResult r = evaluate_perplexity(*x.model, text_tokens, opt);
      x.eval_tps = r.tokens_per_second;
      x.eval_ppl = r.ppl;
    }
  }

  const Variant& f = v[0];
  std::printf("sgemm bound of pp%lld: the prefill's %.2f GFLOP at ops::sgemm's rate on this model's linear shapes, %.1f GFLOP/s: %.3f s = "
              "%.1f tok/s; strict bound (the faster of ops::sgemm and oneDNN matmul, %.1f GFLOP/s, per shape): %.1f GFLOP/s, %.1f tok/s "
              "(for reference: matmul on packed weights, hot, %.1f GFLOP/s)\n",
              static_cast<long long>(np), bound.flops / 1e9, bound.sgemm_gflops, bound.seconds, np / bound.seconds, bound.plain_gflops,
              bound.best_gflops, np / bound.strict_seconds, bound.packed_gflops);
  std::printf("%-18s %-46s %10s %7s %10s %7s", "variant", "", ("pp" + std::to_string(np) + " tok/s").c_str(), "x FP32",
              ("tg" + std::to_string(ng) + " tok/s").c_str(), "x FP32");
  if (!o.text.empty()) std::printf(" %11s %7s %9s", "eval tok/s", "x FP32", "eval PPL");
  std::printf("\n");
  nlohmann::json rows = nlohmann::json::array();
  for (const Variant& x : v) {
    const double pps = np / x.pp_seconds, tgs = ng / x.tg_seconds;
    std::printf("%-18s %-46s %10.1f %7.2f %10.1f %7.2f", x.name.c_str(), x.description.c_str(), pps, f.pp_seconds / x.pp_seconds, tgs,
                f.tg_seconds / x.tg_seconds);
    nlohmann::json row = {{"name", x.name},
                          {"description", x.description},
                          {"pp_tokens_per_second", pps},
                          {"pp_ratio_to_fp32", f.pp_seconds / x.pp_seconds},
                          {"tg_tokens_per_second", tgs},
                          {"tg_ratio_to_fp32", f.tg_seconds / x.tg_seconds}};
    if (!o.text.empty()) {
      std::printf(" %11.1f %7.2f %9.4f", x.eval_tps, x.eval_tps / f.eval_tps, x.eval_ppl);
      row["eval_tokens_per_second"] = x.eval_tps;
      row["eval_ratio_to_fp32"] = x.eval_tps / f.eval_tps;
      row["eval_ppl"] = x.eval_ppl;
    }
    std::printf("\n");
    rows.push_back(std::move(row));
  }
  const double frac = bound.seconds / f.pp_seconds, strict = bound.strict_seconds / f.pp_seconds;
  std::printf("FP32 pp%lld = %.1f%% of the sgemm bound (target >= 90%%), %.1f%% of the strict bound\n", static_cast<long long>(np),
              100 * frac, 100 * strict);
  const double linear_gflop = bound.flops / 1e9 - bound.attention_flops / 1e9 - bound.head_flops / 1e9;
  std::printf("FP32 model's linears alone (layer order, weights from memory): %.1f GFLOP/s, %.3f s = %.1f%% of the pp%lld time\n",
              linear_gflop / linears_seconds, linears_seconds, 100 * linears_seconds / f.pp_seconds, static_cast<long long>(np));
  nlohmann::json out = {{"model", o.model},
                        {"threads", omp_get_max_threads()},
                        {"prompt_tokens", np},
                        {"gen_tokens", ng},
                        {"sgemm_bound",
                         {{"linear_sgemm_gflops", bound.sgemm_gflops},
                          {"linear_best_gflops", bound.best_gflops},
                          {"linear_matmul_plain_gflops", bound.plain_gflops},
                          {"linear_matmul_packed_gflops", bound.packed_gflops},
                          {"seconds", bound.seconds},
                          {"strict_seconds", bound.strict_seconds},
                          {"gflop", bound.flops / 1e9},
                          {"tokens_per_second", np / bound.seconds},
                          {"strict_tokens_per_second", np / bound.strict_seconds}}},
                        {"fp32_pp_fraction_of_sgemm_bound", frac},
                        {"fp32_pp_fraction_of_strict_bound", strict},
                        {"fp32_linears_alone",
                         {{"seconds", linears_seconds},
                          {"gflops", linear_gflop / linears_seconds},
                          {"fraction_of_pp", linears_seconds / f.pp_seconds}}},
                        {"variants", rows},
                        {"load_average", load_average()}};
  if (!o.text.empty())
    out["eval"] = {{"text", o.text}, {"protocol", "llamacpp"}, {"ctx", o.eval_ctx}, {"chunks", o.eval_chunks}};
  return out;
}

}  // namespace sq::bench
