// sq-calibrate: record activation statistics of a model on sample text or token ids (HDF5, docs/formats.md).
#include <omp.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "calib/calibration_run.h"
#include "core/error.h"
#include "core/memory_budget.h"
#include "core/progress.h"
#include "core/tool_main.h"
#include "formats/calibration_h5.h"
#include "formats/token_ids_file.h"
#include "formats/tokenizer.h"
#include "formats/utf8.h"
#include "model/memory_estimate.h"
#include "model/model_loader.h"
#include "tool_cli.h"

int main(int argc, char** argv) {
  CLI::App app{"sq-calibrate: run a model over N random windows of L tokens of a text and record per-channel "
               "activation statistics (absmax, min/max, sum of squares, per-token absmax percentiles; K/V cache ranges); "
               "optionally GPTQ Hessians (--hessian) and K/V Fisher information (--fisher)."};
  std::string model_path, tokenizer_path, out_path, text_path, ids_path, json_path;
  sq::CalibrationOptions opt;
  int threads = 0;
  bool force = false, quiet = false;
  app.add_option("-m,--model", model_path, "Model: llama2.c .bin, GGUF file or Hugging Face checkpoint directory")->required();
  app.add_option("--tokenizer", tokenizer_path, "Tokenizer (tokenizer.bin, tokenizer.model, tokenizer.json, GGUF model or directory); default: the model's own");
  app.add_option("-f,--file", text_path, "Calibration text: plain text or JSON Lines with a 'text' field, optionally .zst; "
                 "or give --token-ids");
  app.add_option("--token-ids", ids_path,
                 "Calibrate on these token ids instead of a text: whitespace-separated non-negative integers or a JSON array, "
                 "one stream used exactly as given (no BOS added, no tokenizer needed); the windows are cut from it")
      ->type_name("FILE");
  app.add_option("--samples", opt.samples, "Number of random windows (N)")->capture_default_str();
  app.add_option("--seq-len", opt.seq_len, "Tokens per window (L)")->capture_default_str();
  app.add_option("-s,--seed", opt.seed, "Sampling seed")->capture_default_str();
  app.add_flag("--hessian", opt.hessian, "Also record GPTQ Hessians 2XᵀX of every linear input (for sq-convert --gptq)");
  app.add_flag("--fisher", opt.fisher,
               "Also record K (before RoPE, after QK-norm) and V activations of sampled tokens with their diagonal Fisher information "
               "(∂L/∂a)², from a backward pass per window (KVQuant §3.3 weights; FP32 models only)");
  app.add_option("--fisher-tokens", opt.fisher_tokens,
                 "With --fisher: at most this many tokens per layer, sampled uniformly from all windows with the seed "
                 "(each stores its whole K and V rows)")
      ->capture_default_str();
  app.add_option("-o,--output", out_path, "Output calibration file (.h5)")->required();
  app.add_option("-t,--threads", threads, sq::kThreadsHelp);
  app.add_flag("--force", force, "Replace an existing output file");
  app.add_flag("-q,--quiet", quiet, "No progress (a bar on a terminal, else a line with rate and ETA every 30 s)");
  sq::add_json_option(app, json_path,
                      "What was recorded: windows, tokens, Hessians / Fisher, the model fingerprint, seconds, peak_rss_bytes");
  sq::add_version_flag(app, "sq-calibrate");
  if (const int status = sq::parse_tool_args(app, "sq-calibrate", argc, argv); status >= 0) return status;
  return sq::run_tool("sq-calibrate", [&]() {
    sq::apply_thread_option(threads, "sq-calibrate");
    if (app.count("--fisher-tokens") > 0 && !opt.fisher) throw sq::UsageError("--fisher-tokens needs --fisher");
    opt.token_ids = !ids_path.empty();
    if (opt.token_ids && !text_path.empty()) throw sq::UsageError("give either -f FILE or --token-ids FILE, not both");
    if (!opt.token_ids && text_path.empty())
      throw sq::UsageError("give the calibration text with -f FILE or the token ids with --token-ids FILE");
    opt.text_path = opt.token_ids ? ids_path : text_path;
    sq::check_output_path("-o", out_path, force, {model_path, opt.text_path, tokenizer_path});  // before any work
    if (!json_path.empty() && json_path != "-")
      sq::check_output_path("--json", json_path, true, {model_path, opt.text_path, tokenizer_path, out_path});
    sq::StdoutToStderr redirect(json_path == "-");  // stdout is the report's alone
    const auto start = std::chrono::steady_clock::now();
    if (opt.token_ids)
      (void)sq::read_token_ids_file(ids_path);  // its syntax, before the model is loaded (the vocabulary after)
    else if (const std::string w = sq::text_file_encoding_warning(opt.text_path); !w.empty())
      std::fprintf(stderr, "sq-calibrate: warning: %s\n", w.c_str());

    // A Hugging Face directory or GGUF file is read one layer at a time (memory: one layer, not the model),
    // except for work that needs every layer at once: Fisher's backward pass, expert routing.
    {  // the peak estimate, before anything is loaded
      const sq::ModelFootprint fp = sq::model_footprint(model_path);
      const bool streamed = sq::streams_layers(fp) && !opt.fisher && !(opt.hessian && fp.config.spec.n_experts > 0);
      sq::check_memory_fits(sq::estimate_calibrate(fp, streamed, opt.hessian, opt.fisher, opt.seq_len, omp_get_max_threads()),
                            sq::current_memory_budget(), "sq-calibrate" + std::string(opt.hessian ? " --hessian" : "") +
                                                             (opt.fisher ? " --fisher" : "") + " of " + model_path,
                            streamed ? "use fewer threads (-t 1) or a shorter --seq-len"
                                     : "give a Hugging Face directory or GGUF file, which is read one layer at a time, or "
                                       "use fewer threads (-t 1)");
    }
    auto model = std::make_unique<sq::LayerStream>(model_path, !opt.fisher);
    if (model->streamed() && opt.hessian && model->config().spec.n_experts > 0) {
      model.reset();  // one copy of the globals at a time
      model = std::make_unique<sq::LayerStream>(model_path, false);
    }
    std::unique_ptr<sq::Tokenizer> tokenizer;  // token ids need none
    if (!opt.token_ids) tokenizer = sq::open_tokenizer_for(model->model(), tokenizer_path);
    std::unique_ptr<sq::ProgressBar> bar;
    // One bar over all passes: statistics, then Hessians and/or Fisher (each `total` windows); a
    // streamed model runs statistics and Hessians in one pass over the layers.
    const int64_t passes = 1 + (opt.hessian ? 1 : 0) + (opt.fisher ? 1 : 0);
    opt.progress = [&](const char* phase, int64_t done, int64_t total) {
      const std::string p = phase;
      if (p == "layers") {
        if (!bar) bar = std::make_unique<sq::ProgressBar>("sq-calibrate", total, "layers", !quiet);
        bar->update(done);
      } else if (p == "running" || p == "hessians" || p == "fisher") {
        if (!bar) bar = std::make_unique<sq::ProgressBar>("sq-calibrate", passes * total, "windows", !quiet);
        const int64_t before = p == "running" ? 0 : p == "hessians" ? total : (opt.hessian ? 2 : 1) * total;
        const int64_t d = before + done;
        bar->update(d, static_cast<double>(d * opt.seq_len), "tok");
      }
    };
    // A streamed model's Hessians go to the file layer by layer (one layer's held at a time).
    std::unique_ptr<sq::CalibrationH5Writer> writer;
    if (model->streamed() && opt.hessian) {
      writer = std::make_unique<sq::CalibrationH5Writer>(out_path);
      opt.on_layer_hessians = [&](int l, sq::LayerStats& ls) {
        writer->write_hessians(l, ls.hessians, ls.hessian_tokens);
        ls.hessians.clear();
        ls.hessians.shrink_to_fit();
      };
    }
    const sq::CalibrationData data = sq::run_calibration(*model, tokenizer.get(), opt);
    if (bar) bar->finish();
    if (writer) writer->finish(data);
    else sq::write_calibration_h5(out_path, data);
    int64_t tokens = data.layers.empty() ? 0 : data.layers[0].inputs[0].tokens;
    std::printf("sq-calibrate: %lld windows x %lld tokens (%lld tokens) of %s -> %s\n", static_cast<long long>(opt.samples),
                static_cast<long long>(opt.seq_len), static_cast<long long>(tokens), opt.text_path.c_str(), out_path.c_str());
    std::printf("model fingerprint %s\n", data.provenance.model_fingerprint.c_str());
    if (data.has_fisher())
      std::printf("Fisher information: %lld tokens x %lld K/V channels per layer, mean NLL %.4f\n",
                  static_cast<long long>(data.layers[0].kv_fisher.tokens), static_cast<long long>(data.layers[0].kv_fisher.width),
                  data.fisher_mean_loss);
    redirect.restore();
    if (!json_path.empty()) {
      nlohmann::ordered_json j;
      j["model"] = model_path;
      j["output"] = out_path;
      j["text"] = opt.text_path;
      j["windows"] = opt.samples;
      j["seq_len"] = opt.seq_len;
      j["tokens"] = tokens;
      j["seed"] = opt.seed;
      j["hessian"] = opt.hessian;
      j["fisher"] = data.has_fisher();
      if (data.has_fisher()) {
        j["fisher_tokens_per_layer"] = data.layers[0].kv_fisher.tokens;
        j["fisher_mean_nll"] = data.fisher_mean_loss;
      }
      j["model_fingerprint"] = data.provenance.model_fingerprint;
      j["streamed"] = model->streamed();
      j["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      j["output_bytes"] = static_cast<int64_t>(std::filesystem::file_size(out_path));
      sq::write_json_report(json_path, j);
    }
    return sq::kExitOk;
  });
}
