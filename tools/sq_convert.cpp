// sq-convert: SmoothQuant-smooth, quantize and pack a checkpoint into one .sqm file.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "calib/converter.h"
#include "core/error.h"
#include "core/memory_probe.h"
#include "core/progress.h"
#include "core/tool_main.h"
#include "model/model_loader.h"

int main(int argc, char** argv) {
  CLI::App app{"sq-convert: compute SmoothQuant smoothing factors and INT8 weights (W8A8), or re-encode as f32/f16/bf16, "
               "and write one packed, checksummed .sqm model file.\n"
               "Presets (SmoothQuant Table 3.2): O1 = per-tensor weights + per-token dynamic activations, O2 = per-tensor "
               "dynamic, O3 = per-tensor static (calibrated). Without a preset: per-channel weights, per-token activations."};
  std::string model_path, out_path, alpha = "0.5", preset, weight, act, scheme = "w8a8";
  sq::ConvertOptions o;
  bool no_smooth = false, quiet = false, report_memory = false;
  int threads = 0;
  app.add_option("-m,--model", model_path, "Model: llama2.c .bin or Hugging Face checkpoint directory")->required();
  app.add_option("--tokenizer", o.tokenizer_path, "Tokenizer to embed in the output (default: the model's own, if any)");
  app.add_option("--calib", o.calib_path, "Calibration file from sq-calibrate (needed for smoothing and O3)");
  app.add_option("--scheme", scheme, "w8a8 | f32 | f16 | bf16")->capture_default_str();
  app.add_option("--alpha", alpha, "SmoothQuant migration strength in [0,1], or 'auto' (grid search per group)")->capture_default_str();
  app.add_flag("--no-smooth", no_smooth, "Naive W8A8: no smoothing");
  app.add_flag("--smooth-vo", o.smooth_vo, "Also smooth o_proj inputs (folded into v_proj rows; exact under GQA)");
  app.add_option("--preset", preset, "O1 | O2 | O3 (SmoothQuant Table 3.2)");
  app.add_option("--weight", weight, "per-channel | per-tensor (overrides the preset)");
  app.add_option("--act", act, "per-token | per-tensor-dynamic | per-tensor-static (overrides the preset)");
  app.add_flag("--quantize-head", o.quantize_head, "Also quantize the LM head to W8A8");
  app.add_option("--alpha-windows", o.alpha_windows, "Calibration windows used by --alpha auto")->capture_default_str();
  app.add_flag("--compress", o.write.compress, "zstd-compress tensors (per tensor, kept when smaller)");
  app.add_flag("--force", o.write.force, "Replace an existing output file");
  app.add_option("-o,--output", out_path, "Output .sqm file")->required();
  app.add_option("-t,--threads", threads, "Threads (default: all cores)");
  app.add_flag("-q,--quiet", quiet, "No progress bar");
  app.add_flag("--report-memory", report_memory, "Print the peak anonymous resident memory (sampled RssAnon) on stderr");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : sq::kExitInput;
  }
  return sq::run_tool("sq-convert", [&]() {
    if (threads > 0) omp_set_num_threads(threads);
    o.scheme = sq::parse_scheme(scheme);
    o.smooth = !no_smooth;
    if (no_smooth && app.count("--alpha")) throw sq::UsageError("--alpha has no effect with --no-smooth; give one or the other");
    if (alpha == "auto") {
      o.alpha_auto = true;
    } else {
      size_t used = 0;
      try {
        o.alpha = std::stof(alpha, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != alpha.size()) throw sq::UsageError("--alpha must be a number in [0, 1] or 'auto', got '" + alpha + "'");
      if (!(o.alpha >= 0.0f && o.alpha <= 1.0f)) throw sq::UsageError("--alpha must be in [0, 1], got " + alpha);
    }
    if (!preset.empty()) {
      if (preset != "O1" && preset != "O2" && preset != "O3") throw sq::UsageError("--preset must be O1, O2 or O3, got '" + preset + "'");
      o.preset = preset;
      o.weight = sq::WeightGranularity::PerTensor;  // Table 3.2: per-tensor weights at every level
      o.act = preset == "O1" ? sq::ActQuant::PerToken : preset == "O2" ? sq::ActQuant::PerTensorDynamic : sq::ActQuant::PerTensorStatic;
    }
    if (!weight.empty()) {
      if (weight == "per-channel") o.weight = sq::WeightGranularity::PerChannel;
      else if (weight == "per-tensor") o.weight = sq::WeightGranularity::PerTensor;
      else throw sq::UsageError("--weight must be per-channel or per-tensor, got '" + weight + "'");
    }
    if (!act.empty()) {
      if (act == "per-token") o.act = sq::ActQuant::PerToken;
      else if (act == "per-tensor-dynamic") o.act = sq::ActQuant::PerTensorDynamic;
      else if (act == "per-tensor-static") o.act = sq::ActQuant::PerTensorStatic;
      else throw sq::UsageError("--act must be per-token, per-tensor-dynamic or per-tensor-static, got '" + act + "'");
    }
    sq::check_output_is_not_an_input(out_path, {model_path, o.calib_path, o.tokenizer_path});

    std::unique_ptr<sq::PeakRssAnonSampler> mem;
    if (report_memory) mem = std::make_unique<sq::PeakRssAnonSampler>();
    sq::LoadedModel src = sq::load_model(model_path);
    if (o.tokenizer_path.empty()) o.tokenizer_path = src.default_tokenizer;
    std::unique_ptr<sq::ProgressBar> bar;
    o.progress = [&](int64_t done, int64_t total) {
      if (!bar) bar = std::make_unique<sq::ProgressBar>("sq-convert", total, "layers", !quiet);
      bar->update(done);
    };
    const sq::ConvertSummary s = sq::convert_model(src, o, out_path);
    if (bar) bar->finish();
    if (mem) {
      mem->stop();
      std::fprintf(stderr, "sq-convert: peak RssAnon %.1f MiB\n", static_cast<double>(mem->peak_bytes()) / (1 << 20));
    }
    std::printf("sq-convert: %s -> %s (%s, %.2f MiB)\n", model_path.c_str(), out_path.c_str(), scheme.c_str(),
                static_cast<double>(s.file_bytes) / (1 << 20));
    if (!s.groups.empty()) {
      std::printf("smoothing alpha per layer (attn_input / ffn_input%s):", o.smooth_vo ? " / attn_output" : "");
      int layer = -1;
      for (const auto& g : s.groups) {
        if (g.layer != layer) std::printf("\n  layer %d:", layer = g.layer);
        std::printf(" %.2f", g.alpha);
      }
      std::printf("\n");
    }
    return sq::kExitOk;
  });
}
