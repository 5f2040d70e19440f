// sq-convert: SmoothQuant-smooth, quantize and pack a checkpoint into one .sqm file.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <memory>
#include <vector>

#include "calib/converter.h"
#include "calib/kv_calibration.h"
#include "calib/recipe_kv.h"
#include "core/error.h"
#include "core/memory_budget.h"
#include "core/memory_probe.h"
#include "core/progress.h"
#include "core/tool_main.h"
#include "model/memory_estimate.h"
#include "model/model_loader.h"
#include "tool_cli.h"

/// sq-convert warns when per-tensor weights' rounding error exceeds this multiple of per-channel's.
/// stories260K O1: about 2-3x (no warning; its PPL cost is small); SmolLM2 and Qwen2.5, whose O1
/// PPL costs are +7% and +32%, are far above it (docs/reliability.md).
constexpr double kPerTensorWarnRatio = 10.0;

int main(int argc, char** argv) {
  CLI::App app{"sq-convert: compute SmoothQuant smoothing factors and INT8 weights (W8A8), group-wise INT4 weights (W4A16), "
               "Atom W4A4 with INT8 outlier channels (w4a4-atom), or re-encode as f32/f16/bf16, "
               "and write one packed, checksummed .sqm model file.\n"
               "Presets (SmoothQuant Table 3.2): O1 = per-tensor weights + per-token dynamic activations, O2 = per-tensor "
               "dynamic, O3 = per-tensor static (calibrated). Without a preset: per-channel weights, per-token activations."};
  std::string model_path, out_path, alpha = "0.5", preset, weight, act, scheme = "w8a8";
  sq::ConvertOptions o;
  bool no_smooth = false, quiet = false, report_memory = false;
  int threads = 0;
  app.add_option("-m,--model", model_path, "Model: llama2.c .bin, GGUF file or Hugging Face checkpoint directory")->required();
  app.add_option("--tokenizer", o.tokenizer_path, "Tokenizer to embed in the output (default: the model's own, if any)");
  app.add_option("--calib", o.calib_path,
                 "Calibration file from sq-calibrate (needed for smoothing and O3, GPTQ and Atom; W4A16 RTN: the per-channel "
                 "importance of the scale search)");
  app.add_option("--calib-text", o.calib_text,
                 "The calibration text, for --alpha auto, sequential GPTQ and --clip search (default: the path the calibration "
                 "file records; its SHA-256 must match)");
  app.add_option("--scheme", scheme, "w8a8 | w4a16 | w4a4-atom | f32 | f16 | bf16")->capture_default_str();
  app.add_option("--alpha", alpha, "SmoothQuant migration strength in [0,1], or 'auto' (grid search per group)")->capture_default_str();
  app.add_flag("--no-smooth", no_smooth, "Naive W8A8: no smoothing");
  app.add_flag("--smooth-vo", o.smooth_vo, "Also smooth o_proj inputs (folded into v_proj rows; exact under GQA)");
  std::string rotate = "auto";
  app.add_option("--rotate", rotate,
                 "auto | none | hadamard: QuaRot Hadamard rotations after smoothing: online at every linear's input (the runner "
                 "rotates the attention input, FFN input and FFN hidden activations before quantizing them), folded per head into "
                 "v_proj/o_proj. For w8a8 with dynamic activations and the float schemes. auto = hadamard for --scheme w8a8 without "
                 "--preset with dynamic activations and no nuq KV format (the most accurate INT8 recipe, docs/results.md section 8), "
                 "none otherwise. Files with online rotations run in sq-run/sq-eval (CPU) and export to compressed-tensors (as its "
                 "transform_config); GGUF, --format hf and the CUDA runner need --rotate none")
      ->capture_default_str();
  app.add_option("--preset", preset, "O1 | O2 | O3 (SmoothQuant Table 3.2)");
  app.add_option("--weight", weight, "per-channel | per-tensor (overrides the preset)");
  app.add_option("--act", act, "per-token | per-token-group (a step per token and block of 32 inputs, as llama.cpp's Q8_0 dot product) | "
                 "per-tensor-dynamic | per-tensor-static (overrides the preset)");
  CLI::Option* head_opt = app.add_flag(
      "--quantize-head,!--no-quantize-head", o.quantize_head,
      "Also quantize the token embedding and LM head to INT8 rows with one step per row (dequantized on lookup; the head runs with FP32 "
      "activations for w4a16/w4a4-atom, as W8A8 with --weight/--act for w8a8). Default: on for w4a16 (the whole file at ~4.5 bits/weight "
      "plus an 8-bit embedding, as llama.cpp's Q4_0), off otherwise; --no-quantize-head keeps them FP32");
  app.add_option("--token-embedding-type", o.token_embedding_type,
                 "With --quantize-head: the token embedding's format, int8 (rows with one FP16 step, as Q8_0) | int4 (--scheme "
                 "w4a16: the linears' group-wise INT4 format, as llama.cpp's Q4_K_M stores token_embd; a tied head then runs "
                 "as that 4-bit matrix) | auto (w4a16 with an untied head: int4, as llama.cpp's Q4_0 / Q4_K_M files; otherwise int8)")
      ->check(CLI::IsMember({"auto", "int8", "int4"}))
      ->capture_default_str();
  std::string head_activations;
  app.add_option("--head-activations", head_activations,
                 "w8a8 with --quantize-head: int8 (default: the head runs as W8A8 with --act) | fp32 (the head runs with FP32 "
                 "activations, W8A16, as in w4a16 files: its input is not rounded)");
  bool sym = false;
  app.add_option("--group-size", o.int4.group_size,
                 "W4A16 / W4A4: input columns per INT4 group (32, 64 or 128; W4A4 also 0 = per channel / per token)")
      ->capture_default_str();
  app.add_flag("--sym", sym, "W4A16: symmetric INT4 (the default)");
  app.add_flag("--asym", o.int4.asym, "W4A16: asymmetric INT4 with a zero point per group");
  CLI::Option* k_quant_opt = app.add_flag(
      "--k-quant,!--no-k-quant", o.int4.k_quant,
      "W4A16: GGML's Q4_K layout (groups of 32 with an FP16-derived scale and minimum each, 6-bit sub-scales per "
      "super-block of 256: 4.5 bits/weight; implies --group-size 32 --asym; RTN with the importance-weighted search, or "
      "GPTQ on its grid with --gptq; "
      "exports to GGUF as Q4_K, not to compressed-tensors). The default of --scheme w4a16 unless --group-size, --sym, "
      "--asym, --gptq, --awq or --observer minmax asks for the flat group layout; --no-k-quant: the flat layout "
      "(default group size 128, symmetric)");
  CLI::Option* gptq_opt = app.add_flag(
      "--gptq,!--no-gptq", o.int4.gptq,
      "GPTQ (needs --calib) instead of round-to-nearest: W4A16 / W4A4 groups, W8A8 per-channel INT8 weights (on the smoothed and "
      "rotated linears). Default: on for w8a8 when the calibration file holds Hessians (sq-calibrate --hessian; used as they are), "
      "off otherwise");
  std::string observer = "mse";
  app.add_option("--observer", observer,
                 "W4A16: how each group's scale is chosen: mse = search minimizing the weighted squared error, full-range "
                 "codes -8..7 with a signed scale as GGML Q4_0 (weights: --calib's per-channel sum of squares, GPTQ's Hessian "
                 "diagonal, else uniform) | minmax = absmax/7 (asym: min/max)")
      ->capture_default_str();
  app.add_option("--bits-per-weight", o.mixed.bits_per_weight,
                 "W4A16 mixed precision: store the linears most sensitive per bit as INT8 rows (run with FP32 activations) "
                 "instead of 4-bit, up to B storage bits per weight over the quantized linears (needs --calib; each linear's "
                 "KL divergence is measured on the calibration windows)");
  app.add_option("--max-kld", o.mixed.max_kld,
                 "W4A16 mixed precision: the fewest INT8 linears whose estimated KL divergence (the sum of the single-linear "
                 "KLDs measured on the calibration windows) is at most X nats");
  app.add_option("--mixed-windows", o.mixed_windows,
                 "--bits-per-weight / --max-kld: calibration windows the sensitivities are measured and the assignment's KLD "
                 "checked on (with --sensitivity-from: checked only; default there: the recorded measurement's)")
      ->capture_default_str();
  app.add_option("--sensitivity-from", o.mixed_sensitivity_from,
                 "--bits-per-weight / --max-kld: reuse the sensitivities recorded in an earlier .sqm of the same model and "
                 "4-bit format (another budget without measuring again)");
  std::string outliers = "auto", outlier_format = "int8";
  app.add_option("--outlier-channels", outliers,
                 "W4A4: outlier channels per linear input, by calibration sum of squares: N, or auto = min(128, width/16)")
      ->capture_default_str();
  app.add_option("--outlier-format", outlier_format, "W4A4: int8 | fp32 (precision of the outlier channels)")->capture_default_str();
  app.add_option("--clip", o.atom.clip, "W4A4: none | default (--weight-clip/--act-clip) | search (grid per linear on calibration data)")
      ->capture_default_str();
  app.add_option("--weight-clip", o.atom.weight_clip, "W4A4: weight clipping ratio in (0, 1] for --clip default")->capture_default_str();
  app.add_option("--act-clip", o.atom.act_clip, "W4A4: activation clipping ratio in (0, 1] for --clip default")->capture_default_str();
  app.add_flag("--awq", o.awq,
               "W4A16: AWQ activation-aware scaling (Lin et al. 2024) before quantizing: every exact smoothing mapping (input "
               "norms, v -> o, up -> down) scales its linears' input channels by RMS^alpha, alpha per mapping searched on "
               "0..0.95 minimizing the INT4 output error on calibration activations; folded into norms and rows, no runtime "
               "cost (needs --calib and the tokenizer; with --gptq the file's Hessians)");
  app.add_flag("--act-order", o.int4.act_order, "GPTQ: quantize columns by descending Hessian diagonal (static groups)");
  app.add_option("--damp", o.int4.damp, "GPTQ: dampening, fraction of the mean Hessian diagonal")->capture_default_str();
  app.add_option("--gptq-hessians", o.gptq_hessians,
                 "GPTQ: sequential (recompute per layer on the quantized model's inputs from the calibration windows), "
                 "file (sq-calibrate --hessian), or auto (sequential when a tokenizer is given, else file)")
      ->capture_default_str();
  std::string kv, kv_keys, kv_key_axis;
  int kv_group = -1, kv_sink = -1;
  double kv_outliers = -1;
  bool kv_qnorm = false;
  app.add_option("--kv", kv,
                 "KV-cache format to record: fp32 | int8 | int4 | int3 | int2 (uniform per-token asymmetric, Atom 4.4) | "
                 "nuq4 | nuq3 | nuq2 (KVQuant; needs --calib from sq-calibrate --fisher)");
  app.add_option("--kv-group", kv_group, "Uniform KV formats: channels per scale/zero-point group (default: head_dim)");
  app.add_option("--kv-outliers", kv_outliers, "nuq: fraction of per-vector dense-and-sparse FP16 outliers, e.g. 0.01");
  app.add_flag("--kv-qnorm", kv_qnorm, "nuq: Q-Norm centroids (KVQuant 3.5)");
  app.add_option("--kv-sink-fp16", kv_sink, "Keep the first N tokens in FP16 (KVQuant 3.6; nuq default 1, int default 0)");
  app.add_option("--kv-keys", kv_keys, "Quantize keys pre-rope | post-rope (nuq default pre-rope, int post-rope; RoPE models only)");
  std::string kv_weighting = "fisher";
  app.add_option("--kv-weighting", kv_weighting,
                 "nuq: k-means weights: fisher (KVQuant Eq. 2, from sq-calibrate --fisher) | uniform (ablation)")
      ->capture_default_str();
  app.add_option("--kv-key-axis", kv_key_axis, "nuq: key scaling per-channel (offline, default) | per-token (online)");
  app.add_option("--alpha-windows", o.alpha_windows, "Calibration windows used by --alpha auto")->capture_default_str();
  app.add_flag("--compress", o.write.compress, "zstd-compress tensors (per tensor, kept when smaller)");
  app.add_flag("--force", o.write.force, "Replace an existing output file");
  app.add_option("-o,--output", out_path, "Output .sqm file")->required();
  app.add_option("-t,--threads", threads, sq::kThreadsHelp);
  app.add_flag("-q,--quiet", quiet, "No progress (a bar on a terminal, else a line with rate and ETA every 30 s)");
  app.add_flag("--report-memory", report_memory, "Print the peak anonymous resident memory (sampled RssAnon) on stderr");
  std::string json_path;
  sq::add_json_option(app, json_path,
                      "What was written: scheme, file bytes, seconds, GPTQ's Hessian source, each linear's Hessian-weighted "
                      "error, alpha per smoothed group, mixed-precision choices, peak_rss_bytes");
  sq::add_version_flag(app, "sq-convert");
  if (const int status = sq::parse_tool_args(app, "sq-convert", argc, argv); status >= 0) return status;
  return sq::run_tool("sq-convert", [&]() {
    sq::apply_thread_option(threads, "sq-convert");
    const sq::ConvertSpec spec = sq::parse_convert_flags(
        {scheme, alpha, app.count("--alpha") > 0, no_smooth, preset, weight, act});  // UsageError
    o.scheme = spec.scheme;
    o.smooth = spec.smooth;
    o.alpha = spec.alpha;
    o.alpha_auto = spec.alpha_auto;
    o.preset = spec.preset;
    o.weight = spec.weight;
    o.act = spec.act;
    if (sym && o.int4.asym) throw sq::UsageError("--sym and --asym exclude each other");
    if (k_quant_opt->count() && o.scheme != sq::ConvertScheme::W4A16)
      throw sq::UsageError("--k-quant applies to --scheme w4a16 only (so does --no-k-quant)");
    // The default W4A16 layout is Q4_K, the most accurate at its size (docs/results.md, "GGML's Q4_K
    // layout"); an option of the flat group layout (or GPTQ / AWQ, which quantize in it) selects that.
    const bool flat_layout_flags = app.count("--group-size") || sym || o.int4.asym || o.int4.gptq || o.awq ||
                                   (app.count("--observer") && observer != "mse");
    if (k_quant_opt->count() == 0) o.int4.k_quant = o.scheme == sq::ConvertScheme::W4A16 && !flat_layout_flags;
    if (o.int4.k_quant) {
      if (sym || (app.count("--group-size") && o.int4.group_size != 32))
        throw sq::UsageError("--k-quant is GGML's Q4_K layout: groups of 32 with a minimum each (drop --sym / --group-size)");
      if (app.count("--observer") && observer != "mse") throw sq::UsageError("--k-quant always uses the importance-weighted search (drop --observer minmax)");
      o.int4.group_size = 32;
      o.int4.asym = true;
    }
    const bool atom = o.scheme == sq::ConvertScheme::W4A4Atom;
    const bool atom_flags = app.count("--outlier-channels") || app.count("--outlier-format") || app.count("--clip") ||
                            app.count("--weight-clip") || app.count("--act-clip");
    if (atom_flags && !atom)
      throw sq::UsageError("--outlier-channels/--outlier-format/--clip/--weight-clip/--act-clip apply to --scheme w4a4-atom only");
    if (atom && (sym || o.int4.asym)) throw sq::UsageError("--scheme w4a4-atom is symmetric only (Atom §4.3): drop --sym/--asym");
    const bool int4_flags = app.count("--group-size") || sym || o.int4.asym || o.int4.k_quant;
    const bool gptq_flags = o.int4.gptq || app.count("--damp") || o.int4.act_order || app.count("--gptq-hessians");
    if (observer != "mse" && observer != "minmax") throw sq::UsageError("--observer must be mse or minmax, got '" + observer + "'");
    if (app.count("--observer") && o.scheme != sq::ConvertScheme::W4A16) throw sq::UsageError("--observer applies to --scheme w4a16 only");
    o.int4.scale_search = observer == "mse";
    const bool w8a8_flags = app.count("--alpha") || app.count("--no-smooth") || app.count("--smooth-vo") || app.count("--preset") ||
                            app.count("--weight") || app.count("--act");
    if (w8a8_flags && o.scheme != sq::ConvertScheme::W8A8)
      throw sq::UsageError("--alpha/--no-smooth/--smooth-vo/--preset/--weight/--act apply to --scheme w8a8 only");
    if (!head_activations.empty() && head_activations != "int8" && head_activations != "fp32")
      throw sq::UsageError("--head-activations must be int8 or fp32, got '" + head_activations + "'");
    if (!head_activations.empty() && o.scheme != sq::ConvertScheme::W8A8)
      throw sq::UsageError("--head-activations applies to --scheme w8a8 (the other schemes' INT8 heads always run with FP32 activations)");
    o.head_fp32_activations = head_activations == "fp32";
    if (rotate != "auto" && rotate != "none" && rotate != "hadamard")
      throw sq::UsageError("--rotate must be auto, none or hadamard, got '" + rotate + "'");
    // SmoothQuant smoothing needs the calibration's per-channel absmax: without --calib (and no
    // --alpha or --preset asking for it) the default w8a8 recipe is rotation alone.
    const bool smooth_default_off = o.scheme == sq::ConvertScheme::W8A8 && o.smooth && o.calib_path.empty() &&
                                    !app.count("--alpha") && preset.empty();
    if (smooth_default_off) o.smooth = false;
    const bool float_scheme = sq::is_float_scheme(o.scheme);
    if (head_opt->count() == 0) o.quantize_head = o.scheme == sq::ConvertScheme::W4A16;
    if (o.quantize_head && float_scheme) throw sq::UsageError("--quantize-head applies to the quantized schemes (w8a8, w4a16, w4a4-atom)");
    if (o.awq && o.scheme != sq::ConvertScheme::W4A16) throw sq::UsageError("--awq applies to --scheme w4a16 only");
    if (int4_flags && o.scheme != sq::ConvertScheme::W4A16 && !atom)
      throw sq::UsageError("--group-size/--sym/--asym apply to --scheme w4a16 or w4a4-atom only");
    if (gptq_flags && float_scheme) throw sq::UsageError("--gptq/--act-order/--damp/--gptq-hessians apply to the quantized schemes (w8a8, w4a16, w4a4-atom)");
    if (atom) {
      if (outliers == "auto") {
        o.atom.outlier_channels = -1;
      } else {
        size_t used = 0;
        long long v = -1;
        try {
          v = std::stoll(outliers, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != outliers.size() || v < 0)
          throw sq::UsageError("--outlier-channels must be a count ≥ 0 or 'auto', got '" + outliers + "'");
        o.atom.outlier_channels = v;
      }
      if (outlier_format == "int8") o.atom.outlier_format = sq::W4A4OutlierFormat::Int8;
      else if (outlier_format == "fp32") o.atom.outlier_format = sq::W4A4OutlierFormat::Fp32;
      else throw sq::UsageError("--outlier-format must be int8 or fp32, got '" + outlier_format + "'");
      if ((app.count("--weight-clip") || app.count("--act-clip")) && o.atom.clip != "default")
        throw sq::UsageError("--weight-clip/--act-clip apply to --clip default only");
      o.atom.group_size = o.int4.group_size;
      o.atom.gptq = o.int4.gptq;
      o.atom.act_order = o.int4.act_order;
      o.atom.damp = o.int4.damp;
      sq::validate_atom_options(o.atom);
      if (!o.calib_path.empty() && !o.atom.gptq && o.atom.clip != "search" && o.atom.outlier_channels == 0)
        throw sq::UsageError("--calib has no effect on --scheme w4a4-atom without outliers, --gptq or --clip search");
    }
    const bool mixed = app.count("--bits-per-weight") || app.count("--max-kld");
    if (app.count("--bits-per-weight") && app.count("--max-kld")) throw sq::UsageError("--bits-per-weight and --max-kld exclude each other");
    if (app.count("--bits-per-weight") && !(o.mixed.bits_per_weight > 0))
      throw sq::UsageError("--bits-per-weight must be positive, got " + std::to_string(o.mixed.bits_per_weight));
    if (app.count("--max-kld") && !(o.mixed.max_kld > 0)) throw sq::UsageError("--max-kld must be positive, got " + std::to_string(o.mixed.max_kld));
    if ((app.count("--mixed-windows") || app.count("--sensitivity-from")) && !mixed)
      throw sq::UsageError("--mixed-windows / --sensitivity-from need --bits-per-weight or --max-kld");
    o.mixed_windows_given = app.count("--mixed-windows") > 0;
    if ((o.int4.act_order || app.count("--damp") || app.count("--gptq-hessians")) && !o.int4.gptq)
      throw sq::UsageError("--act-order/--damp/--gptq-hessians need --gptq");
    if (o.scheme == sq::ConvertScheme::W4A16 && !o.calib_path.empty() && !o.int4.gptq && !o.int4.scale_search)
      throw sq::UsageError("--calib has no effect on --scheme w4a16 --observer minmax without --gptq (round-to-nearest needs no calibration)");
    const bool kv_flags = kv_group >= 0 || kv_outliers >= 0 || kv_qnorm || kv_sink >= 0 || !kv_keys.empty() || !kv_key_axis.empty();
    if (kv_flags && kv.empty()) throw sq::UsageError("--kv-group/--kv-outliers/--kv-qnorm/--kv-sink-fp16/--kv-keys/--kv-key-axis need --kv");
    sq::KVSpec kv_spec;
    if (!kv.empty()) {
      kv_spec = sq::parse_kv_spec(kv);
      sq::apply_kv_options(kv_spec, kv_group, kv_outliers, kv_qnorm, kv_sink, kv_keys, kv_key_axis);
    }
    o.rotate = rotate == "hadamard" || (rotate == "auto" && o.scheme == sq::ConvertScheme::W8A8 && preset.empty() &&
                                        o.act != sq::ActQuant::PerTensorStatic && kv_spec.kind != sq::KVKind::Nuq);
    o.w8a8_gptq_when_hessians = o.scheme == sq::ConvertScheme::W8A8 && gptq_opt->count() == 0;
    sq::check_output_path("-o", out_path, o.write.force, {model_path, o.calib_path, o.tokenizer_path, o.calib_text, o.mixed_sensitivity_from});  // before any work
    if (!json_path.empty() && json_path != "-")
      sq::check_output_path("--json", json_path, true,
                            {model_path, o.calib_path, o.tokenizer_path, o.calib_text, o.mixed_sensitivity_from, out_path});
    sq::StdoutToStderr redirect(json_path == "-");  // stdout is the report's alone
    const auto start = std::chrono::steady_clock::now();

    std::unique_ptr<sq::PeakRssAnonSampler> mem;
    if (report_memory) mem = std::make_unique<sq::PeakRssAnonSampler>();
    // A Hugging Face directory or GGUF file is read one layer at a time (memory: one layer, not the model),
    // except for what runs the whole model: --alpha auto, --awq, fitting a nuq KV format, mixed precision.
    const bool whole = o.alpha_auto || o.awq || kv_spec.kind == sq::KVKind::Nuq || mixed;
    {  // the peak estimate, before anything is loaded
      const sq::ModelFootprint fp = sq::model_footprint(model_path);
      const bool runs_forward = o.alpha_auto || o.awq || (o.int4.gptq && o.gptq_hessians != "file") || o.atom.clip == "search" || mixed;
      // W8A8's default GPTQ holds a calibration file's Hessians of one layer (when it has them).
      const bool gptq = o.int4.gptq || (o.w8a8_gptq_when_hessians && !o.calib_path.empty());
      sq::check_memory_fits(sq::estimate_convert(fp, sq::streams_layers(fp) && !whole, gptq, runs_forward,
                                                 std::min(512, fp.config.max_seq_len), omp_get_max_threads()),
                            sq::current_memory_budget(), "sq-convert of " + model_path,
                            "a Hugging Face directory or GGUF file is converted one layer at a time (without --alpha auto, a nuq KV format or "
                            "--bits-per-weight / --max-kld)");
    }
    const sq::LayerStream stream(model_path, !whole);
    const sq::LoadedModel& src = stream.model();
    // A GGUF model's tokenizer is its metadata (default_tokenizer = the .gguf): the converter embeds a
    // metadata-only GGUF of its tokenizer.* keys (formats/gguf_tokenizer.h), never the weights.
    if (o.tokenizer_path.empty()) o.tokenizer_path = src.default_tokenizer;
    sq::check_kv_spec(kv_spec, src.model->config());
    sq::check_kv_keys_option(kv_keys, src.model->config());
    if (kv_weighting != "fisher" && kv_weighting != "uniform")
      throw sq::UsageError("--kv-weighting '" + kv_weighting + "': expected fisher or uniform");
    if (app.count("--kv-weighting") && kv_spec.kind != sq::KVKind::Nuq) throw sq::UsageError("--kv-weighting applies to the nuq formats only");
    o.kv = sq::fit_kv_for_conversion(kv_spec, o, src, kv_weighting == "fisher");
    std::unique_ptr<sq::ProgressBar> bar;
    o.progress = [&](int64_t done, int64_t total) {
      if (!bar) bar = std::make_unique<sq::ProgressBar>("sq-convert", total, "layers", !quiet);
      bar->update(done);
    };
    std::unique_ptr<sq::ProgressBar> sens_bar;
    o.mixed_progress = [&](int64_t done, int64_t total) {
      if (!sens_bar) sens_bar = std::make_unique<sq::ProgressBar>("sq-convert sensitivity", total, "linears", !quiet);
      sens_bar->update(done);
      if (done == total) sens_bar->finish();
    };
    const sq::ConvertSummary s = sq::convert_model(stream, o, out_path);
    if (bar) bar->finish();
    if (o.tokenizer_path.empty())  // after the file is written: a failed conversion prints only its error
      std::fprintf(stderr,
                   "sq-convert: warning: %s has no embedded tokenizer (no tokenizer given with --tokenizer or found beside "
                   "%s); tools will need --tokenizer\n",
                   out_path.c_str(), model_path.c_str());
    // Per-tensor weight scales (the presets) can cost far more than per-channel ones on real models
    // (Qwen2.5-Coder-1.5B O1: +32% PPL against +1.2%): print the measured ratio, warn when it is large.
    if (const auto& e = s.w8a8_weight_error; e.per_channel > 0) {
      const double ratio = e.per_tensor / e.per_channel;
      const char* weighting = e.calibration_weighted ? "each input channel weighted by the calibration's sum of x^2" : "unweighted";
      std::printf("per-tensor weight scales: %.1fx the weight rounding error of per-channel scales (%s)\n", ratio, weighting);
      if (ratio > kPerTensorWarnRatio)
        std::fprintf(stderr,
                     "sq-convert: warning: per-tensor weight scales%s give %.0fx the weight rounding error of per-channel scales "
                     "on this model; per-channel weights run on the same INT8 GEMMs: add --weight per-channel\n",
                     preset.empty() ? "" : (" (--preset " + preset + ")").c_str(), ratio);
    }
    if (!s.w8a8_gptq.empty()) {  // GPTQ's objective against round-to-nearest's, same Hessians
      double g = 0, r = 0, worst = 0;
      std::string worst_name;
      for (const auto& l : s.w8a8_gptq) {
        g += l.gptq_error;
        r += l.rtn_error;
        if (l.rtn_error > 0 && l.gptq_error / l.rtn_error > worst) worst = l.gptq_error / l.rtn_error, worst_name = l.name;
      }
      std::printf("gptq: Hessian-weighted weight error %.3f of round-to-nearest's (sum over %zu linears; highest ratio %.3f, %s)\n",
                  r > 0 ? g / r : 0.0, s.w8a8_gptq.size(), worst, worst_name.c_str());
    }
    if (o.scheme == sq::ConvertScheme::W8A8)
      std::printf("w8a8 recipe: %s weights (%s), %s activations, %s, %s\n", sq::to_string(o.weight),
                  !s.w8a8_gptq.empty() ? (s.hessian_source == "file" ? "GPTQ on the calibration file's Hessians"
                                                                        : "GPTQ on Hessians recomputed from the calibration windows")
                  : o.w8a8_gptq_when_hessians && !o.calib_path.empty() && o.weight == sq::WeightGranularity::PerChannel
                      ? "round-to-nearest; GPTQ with --gptq or a calibration file from sq-calibrate --hessian"
                      : "round-to-nearest",
                  sq::to_string(o.act),
                  o.smooth ? (o.alpha_auto ? "SmoothQuant alpha auto" : ("SmoothQuant alpha " + alpha).c_str())
                           : (smooth_default_off ? "no smoothing (no --calib)" : "no smoothing"),
                  o.rotate ? "Hadamard rotations (for GGUF or CUDA: --rotate none)" : "no rotation");
    if (mem) {
      mem->stop();
      std::fprintf(stderr, "sq-convert: peak RssAnon %.1f MiB\n", static_cast<double>(mem->peak_bytes()) / (1 << 20));
    }
    std::printf("sq-convert: %s -> %s (%s, %.2f MiB)\n", model_path.c_str(), out_path.c_str(), scheme.c_str(),
                static_cast<double>(s.file_bytes) / (1 << 20));
    if (!s.mixed.is_null()) {  // the chosen assignment: the INT8 linears, most sensitive first
      const auto& m = s.mixed;
      std::printf("mixed precision: %d of %zu linears as INT8 rows, %.3f bits/weight over the quantized linears, estimated KLD %.4f "
                  "(sum of single-linear KLDs on %lld calibration tokens)",
                  m.at("int8_linears").get<int>(), m.at("linears").size(), m.at("bits_per_weight").get<double>(),
                  m.at("estimated_kld").get<double>(), m.at("sensitivity").at("tokens").get<long long>());
      if (m.at("calibration_kld").is_number())
        std::printf(", measured %.4f with every linear in its format (%d assignment round%s)", m.at("calibration_kld").get<double>(),
                    m.at("assignment_rounds").get<int>(), m.at("assignment_rounds").get<int>() == 1 ? "" : "s");
      std::printf("\n");
      std::vector<const nlohmann::json*> int8;
      for (const auto& l : m.at("linears"))
        if (l.at("format") == "int8") int8.push_back(&l);
      std::stable_sort(int8.begin(), int8.end(), [](const nlohmann::json* a, const nlohmann::json* b) {
        return a->at("kld_int4").get<double>() > b->at("kld_int4").get<double>();
      });
      for (const nlohmann::json* l : int8)
        std::printf("  int8 %-44s KLD as 4-bit %.5f, as INT8 %.6f\n", l->at("name").get<std::string>().c_str(),
                    l->at("kld_int4").get<double>(), l->at("kld_int8_estimate").get<double>());
    }
    if (!s.groups.empty() && (o.alpha_auto || o.awq)) {  // a fixed alpha is the recipe line's
      std::string sites;  // the mappings of a layer (calib/smoothing_mappings.h), e.g. no ffn_input under a shared input norm
      for (const auto& g : s.groups)
        if (g.layer == s.groups.front().layer) sites += (sites.empty() ? "" : " / ") + std::string(sq::activation_site_name(g.site));
      std::printf("%s alpha per layer (%s):", o.awq ? "AWQ" : "smoothing", sites.c_str());
      int layer = -1;
      for (const auto& g : s.groups) {
        if (g.layer != layer) std::printf("\n  layer %d:", layer = g.layer);
        std::printf(" %.2f", g.alpha);
      }
      std::printf("\n");
    }
    redirect.restore();
    if (!json_path.empty()) {
      nlohmann::ordered_json j;
      j["model"] = model_path;
      j["output"] = out_path;
      j["scheme"] = scheme;
      j["file_bytes"] = s.file_bytes;
      j["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      j["streamed"] = stream.streamed();
      if (!s.hessian_source.empty()) j["gptq_hessians"] = s.hessian_source;
      if (!s.w8a8_gptq.empty() || !s.int4.empty()) {  // GPTQ's (or RTN's) Hessian-weighted error per linear
        nlohmann::ordered_json linears = nlohmann::ordered_json::array();
        for (const auto& l : s.w8a8_gptq) linears.push_back({{"name", l.name}, {"gptq_error", l.gptq_error}, {"rtn_error", l.rtn_error}});
        for (const auto& l : s.int4) linears.push_back({{"name", l.name}, {"hessian_error", l.hessian_error}});
        j["linears"] = linears;
      }
      if (!s.groups.empty()) {
        nlohmann::ordered_json groups = nlohmann::ordered_json::array();
        for (const auto& g : s.groups) groups.push_back({{"layer", g.layer}, {"site", sq::activation_site_name(g.site)}, {"alpha", g.alpha}});
        j["smoothing"] = groups;
      }
      if (!s.mixed.is_null()) j["mixed_precision"] = s.mixed;
      sq::write_json_report(json_path, j);
    }
    return sq::kExitOk;
  });
}
