// sq-eval: perplexity of a model on a text file (or pre-tokenized ids) under a named protocol (docs/protocols.md).
#include <omp.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <optional>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/memory_budget.h"
#include "core/progress.h"
#include "core/tool_main.h"
#include "cuda/cuda_eval.h"
#include "cuda/cuda_runtime.h"
#include "cuda/device.h"
#include "eval/hellaswag.h"
#include "eval/kl_divergence.h"
#include "eval/perplexity.h"
#include "eval/sensitivity.h"
#include "eval/streaming.h"
#include "formats/atomic_file.h"
#include "formats/mapped_file.h"
#include "formats/token_ids_file.h"
#include "formats/tokenizer.h"
#include "formats/utf8.h"
#include "model/layer_stream.h"
#include "model/memory_estimate.h"
#include "model/model_loader.h"
#include "model/quantize_in_memory.h"
#include "tool_cli.h"
#include "runtime/thread_governor.h"

int main(int argc, char** argv) {
  CLI::App app{"sq-eval: measure perplexity of a model on a text file, or on token ids (--token-ids); --json reports nll_mean too.\n"
               "Protocols (docs/protocols.md): 'windows' = non-overlapping windows, all ctx-1 predictions scored "
               "(SmoothQuant/GPTQ/KVQuant tables); 'llamacpp' = llama.cpp llama-perplexity (BOS per chunk, second half scored)."};
  std::string model_path, tokenizer_path, text_path, ids_path, protocol = "windows", json_path;
  int ctx = 0, threads = 0;
  int64_t chunks = 0;
  bool allow_long = false, quiet = false;
  std::string kv, kv_keys;
  int kv_group = -1, kv_sink = -1;
  app.add_option("-m,--model", model_path, "Model: llama2.c .bin, GGUF file or Hugging Face checkpoint directory")->required();
  app.add_option("--tokenizer", tokenizer_path, "Tokenizer (tokenizer.bin, tokenizer.model, tokenizer.json, GGUF model or directory); default: the model's own");
  app.add_option("-f,--file", text_path, "Text file to evaluate (UTF-8); or give --token-ids");
  app.add_option("--token-ids", ids_path,
                 "Evaluate these token ids instead of a text: whitespace-separated non-negative integers or a JSON array, "
                 "used exactly as given (no BOS added, no tokenizer needed; llamacpp replaces each chunk's first id by BOS "
                 "only when the model has a tokenizer that adds one)")
      ->type_name("FILE");
  app.add_option("--protocol", protocol,
                 "windows | llamacpp | streaming (token-by-token decoding under --kv-policy, every token scored)")
      ->capture_default_str();
  app.add_option("-c,--ctx,--ctx-size", ctx,
                 "Window/chunk length in tokens (default: min(512, model context)); streaming: stream length "
                 "(default: the whole text)");
  std::string policy_text = "dense";
  int64_t segment = 1000, max_tokens = 0;
  app.add_option("--kv-policy", policy_text,
                 "Streaming: dense | window:W | sink:S,window:W | recompute:W[,stride:K] | h2o:B,recent:R | qhitter:B,recent:R,lambda:L "
                 "(B, R may be N% of the stream)")
      ->capture_default_str();
  app.add_option("--segment", segment, "Streaming: tokens per reported PPL segment")->capture_default_str();
  app.add_option("--max-tokens", max_tokens, "Streaming: use only the first N tokens of the text (default: all)");
  int64_t batch = 1;
  app.add_option("-b,--batch-size", batch,
                 "Streaming: tokens per forward pass. 1 = token by token (decode speed). N > 1 (dense, window, sink policies): "
                 "blocks of N tokens in which every query sees exactly the cache rows and positions it would see token by "
                 "token, so the same PPL up to FP32 rounding, many times faster; tokens/s is then not decode speed")
      ->capture_default_str();
  app.add_option("--chunks", chunks, "Evaluate only the first N chunks (default: all)");
  bool layer_major = false;
  app.add_flag("--layer-major", layer_major,
               "Perplexity protocols: run every chunk through layer 1, then layer 2, ... reading one layer at a time, so that "
               "memory holds one layer, not the model (Hugging Face checkpoints and GGUF files are read from disk layer by layer; the "
               "model under test and --reference-model both). Chosen by itself when such a model does not fit "
               "in memory. Same results up to FP32 rounding; FP32 KV cache for a streamed model");
  sq::add_json_option(app, json_path, "The results");
  bool force = false;
  app.add_flag("--force", force, "Replace an existing --json file");
  app.add_option("-t,--threads", threads, sq::kThreadsHelp);
  app.add_option("--kv", kv,
                 "KV-cache format: fp32 | int8 | int4 | int3 | int2 (uniform per-token asymmetric) | nuq4 | nuq3 | nuq2 "
                 "(KVQuant; needs a model converted with sq-convert --kv nuqX). Default: the model file's format, else fp32");
  app.add_option("--kv-group", kv_group, "Uniform formats: channels per scale/zero-point group (default: head_dim)");
  app.add_option("--kv-sink-fp16", kv_sink, "Uniform formats: keep the first N tokens in FP16 (KVQuant 3.6; default 0)");
  app.add_option("--kv-keys", kv_keys, "fp32/uniform formats: store keys pre-rope (RoPE applied after reading) | post-rope (default); RoPE models only");
  app.add_flag("--allow-long-context", allow_long, "Allow -c larger than the model's trained context");
  std::string w4_act;
  sq::add_w4a16_act_option(app, w4_act, "--protocol streaming only (its forward passes are decode steps); the reference model keeps FP32");
  app.add_flag("-q,--quiet", quiet, "No progress (a bar on a terminal, else a line with rate and ETA every 30 s)");
  std::string device = "cpu";
  app.add_option("--device", device, "cpu | cuda (CUDA: needs a build with SQ_WITH_CUDA and a device; docs/cuda.md)")
      ->capture_default_str();
  std::string reference_path;
  double reference_ppl = 0;
  double max_kld = 0, max_ppl_ratio = 0, min_top1 = 0;
  app.add_option("--reference-model", reference_path,
                 "Also run this reference model (e.g. the FP32 original) on the same tokens, window by window, and report "
                 "its PPL, KL(P_ref||P_test) per token (mean, stderr, median, p99, p99.9, max), top-1 agreement and "
                 "delta-p of the correct token (docs/protocols.md). Same vocabulary size required; the tokenizer is the "
                 "model under test's; the reference always runs dense with an FP32 KV cache")
      ->type_name("MODEL");
  app.add_option("--max-kld", max_kld, "Quality gate: exit 3 when the mean KLD exceeds X (needs --reference-model)")
      ->type_name("X");
  app.add_option("--max-ppl-ratio", max_ppl_ratio,
                 "Quality gate: exit 3 when PPL / reference PPL exceeds R (needs --reference-model or --reference-ppl)")
      ->type_name("R");
  app.add_option("--min-top1", min_top1,
                 "Quality gate: exit 3 when the top-1 agreement (0..1) is below F (needs --reference-model)")
      ->type_name("F");
  app.add_option("--reference-ppl", reference_ppl,
                 "The reference PPL for --max-ppl-ratio when no --reference-model is run (e.g. measured once before)")
      ->type_name("PPL");
  bool sensitivity = false;
  std::string sensitivity_scheme = "w8a8", sensitivity_by = "both";
  app.add_flag("--sensitivity", sensitivity,
               "Quantize one unit of the FP32 model -m at a time (each layer's linears, then each linear kind q/k/v/o/gate/"
               "up/down across all layers), measure KLD, top-1 agreement and delta-PPL against the FP32 model on the same "
               "tokens, and print the units sorted by KLD (windows / llamacpp protocols; docs/protocols.md)");
  app.add_option("--sensitivity-scheme", sensitivity_scheme,
                 "--sensitivity: w8a8 (per-channel INT8 weights, dynamic per-token INT8 activations) | w4a16 (RTN INT4 "
                 "weights, symmetric, groups of 128)")
      ->capture_default_str();
  app.add_option("--sensitivity-by", sensitivity_by, "--sensitivity: layer | kind | both")->capture_default_str();
  app.footer(
      "Exit status: 0 success (every gate holds); 1 runtime or output failure; 2 bad usage or input (nothing "
      "evaluated); 3 a quality gate (--max-kld, --max-ppl-ratio, --min-top1, --min-accuracy, --max-accuracy-drop) is broken: all figures were printed "
      "(and --json written) first, and each broken gate is named on stderr.");
  bool special = false;
  app.add_flag("--special", special,
               "Parse special-token text in the text (e.g. <|im_start|>, a chat template's markers) into its token id; "
               "without it such text is tokenized as plain characters");
  std::vector<std::string> task_args;
  int64_t task_count = 0;
  std::string task_order = "file";
  bool hellaswag_flag = false, json_tasks = false;
  double min_accuracy = 0, max_accuracy_drop = 0;
  app.add_option("--task", task_args,
                 "Task accuracy instead of perplexity: 'hellaswag FILE' (or '--task hellaswag -f FILE'), scored as llama.cpp's "
                 "--hellaswag: the shared context once, each ending by its mean token log-probability (docs/protocols.md)")
      ->expected(1, 2)
      ->type_name("NAME [FILE]");
  app.add_flag("--hellaswag", hellaswag_flag, "Same as --task hellaswag (llama.cpp's option name)");
  app.add_option("--tasks,--hellaswag-tasks", task_count, "--task: evaluate only the first N tasks (default: all)")->type_name("N");
  app.add_option("--task-order", task_order,
                 "--task: 'file' = the first N tasks in file order; 'llamacpp' = llama.cpp's random draw of N tasks "
                 "(std::mt19937 seeded with 1), to reproduce its subset and order")
      ->capture_default_str();
  app.add_flag("--json-tasks", json_tasks,
               "--task with --json: also write each task's index, gold, choice, correct and four scores");
  app.add_option("--min-accuracy", min_accuracy, "Quality gate (--task): exit 3 when the accuracy (0..1) is below A")
      ->type_name("A");
  app.add_option("--max-accuracy-drop", max_accuracy_drop,
                 "Quality gate (--task, needs --reference-model): exit 3 when reference accuracy - accuracy (0..1) exceeds D")
      ->type_name("D");
  sq::add_version_flag(app, "sq-eval");
  if (const int status = sq::parse_tool_args(app, "sq-eval", argc, argv); status >= 0) return status;

  return sq::run_tool("sq-eval", [&]() {
    // Every output is checked before the model is loaded (never an input, never an existing file
    // without --force, its directory exists). With --json - the JSON owns stdout and the summary goes to stderr.
    // --task: task accuracy (eval/hellaswag.h) instead of perplexity; its own options are checked here.
    if (hellaswag_flag) task_args.insert(task_args.begin(), "hellaswag");
    const bool task_mode = !task_args.empty();
    if (task_mode) {
      if (task_args[0] != "hellaswag" || (hellaswag_flag && app.count("--task")))
        throw sq::UsageError(hellaswag_flag && app.count("--task") ? "give either --hellaswag or --task hellaswag, not both"
                                                                     : "--task: the only task is 'hellaswag', got '" + task_args[0] + "'");
      if (task_args.size() == 2) {
        if (!text_path.empty()) throw sq::UsageError("give the HellaSwag file once: --task hellaswag FILE or -f FILE, not both");
        text_path = task_args[1];
      }
      if (text_path.empty()) throw sq::UsageError("--task hellaswag needs the task file: --task hellaswag FILE");
      for (const char* o : {"--token-ids", "--protocol", "--ctx", "--chunks", "--kv-policy", "--segment", "--max-tokens",
                            "--batch-size", "--sensitivity", "--max-ppl-ratio", "--reference-ppl", "--min-top1",
                            "--w4a16-act", "--special", "--allow-long-context"})
        if (app.count(o)) throw sq::UsageError(std::string(o) + " does not apply to --task hellaswag");
      if (device != "cpu") throw sq::UsageError("--task hellaswag runs on the CPU only (--device cpu)");
      if (app.count("--tasks") && task_count < 1)
        throw sq::UsageError("--tasks must be at least 1 (omit it to evaluate every task), got " + std::to_string(task_count));
      if (app.count("--min-accuracy") && !(min_accuracy >= 0 && min_accuracy <= 1))
        throw sq::UsageError("--min-accuracy must be in [0, 1]");
      if (app.count("--max-accuracy-drop") && !(max_accuracy_drop >= 0 && max_accuracy_drop <= 1))
        throw sq::UsageError("--max-accuracy-drop must be in [0, 1]");
      if (app.count("--max-accuracy-drop") && reference_path.empty())
        throw sq::UsageError("--max-accuracy-drop needs --reference-model");
      if (json_tasks && json_path.empty()) throw sq::UsageError("--json-tasks needs --json");
    } else {
      for (const char* o : {"--tasks", "--task-order", "--json-tasks", "--min-accuracy", "--max-accuracy-drop"})
        if (app.count(o)) throw sq::UsageError(std::string(o) + " needs --task hellaswag");
    }
    const sq::TaskOrder order = sq::parse_task_order(task_order);
    const bool from_ids = !ids_path.empty();
    if (from_ids && !text_path.empty()) throw sq::UsageError("give either -f FILE or --token-ids FILE, not both");
    if (!from_ids && text_path.empty()) throw sq::UsageError("give the text with -f FILE or the token ids with --token-ids FILE");
    if (from_ids && special) throw sq::UsageError("--special parses text; token ids (--token-ids) are used as given");
    const std::string input_path = from_ids ? ids_path : text_path;
    if (!json_path.empty())
      sq::check_output_path("--json", json_path, force, {model_path, text_path, ids_path, tokenizer_path, reference_path}, true);
    FILE* out = json_path == "-" ? stderr : stdout;
    sq::QualityGates gates;
    if (app.count("--max-kld")) {
      if (!(max_kld >= 0)) throw sq::UsageError("--max-kld must be >= 0");
      gates.max_kld = max_kld;
    }
    if (app.count("--max-ppl-ratio")) {
      if (!(max_ppl_ratio > 0)) throw sq::UsageError("--max-ppl-ratio must be > 0");
      gates.max_ppl_ratio = max_ppl_ratio;
    }
    if (app.count("--min-top1")) {
      if (!(min_top1 >= 0 && min_top1 <= 1)) throw sq::UsageError("--min-top1 must be in [0, 1]");
      gates.min_top1 = min_top1;
    }
    const bool with_reference = !reference_path.empty();
    if (!with_reference && (gates.max_kld || gates.min_top1))
      throw sq::UsageError(std::string(gates.max_kld ? "--max-kld" : "--min-top1") + " needs --reference-model");
    if (app.count("--reference-ppl")) {
      if (with_reference) throw sq::UsageError("give either --reference-model or --reference-ppl, not both");
      if (!gates.max_ppl_ratio) throw sq::UsageError("--reference-ppl is used only by --max-ppl-ratio; give that too");
      if (!(reference_ppl > 0) || !std::isfinite(reference_ppl)) throw sq::UsageError("--reference-ppl must be a positive number");
    }
    if (gates.max_ppl_ratio && !with_reference && !app.count("--reference-ppl"))
      throw sq::UsageError("--max-ppl-ratio needs --reference-model or --reference-ppl");
    if (!sensitivity && (app.count("--sensitivity-scheme") || app.count("--sensitivity-by")))
      throw sq::UsageError("--sensitivity-scheme and --sensitivity-by need --sensitivity");
    const sq::SensitivityScheme sens_scheme = sq::parse_sensitivity_scheme(sensitivity_scheme);
    if (sensitivity_by != "layer" && sensitivity_by != "kind" && sensitivity_by != "both")
      throw sq::UsageError("--sensitivity-by must be 'layer', 'kind' or 'both', got '" + sensitivity_by + "'");
    if (sensitivity) {
      if (with_reference || gates.any() || app.count("--reference-ppl"))
        throw sq::UsageError("--sensitivity measures against the FP32 model -m itself: leave out --reference-model and the gates");
      if (protocol == "streaming") throw sq::UsageError("--sensitivity runs under --protocol windows or llamacpp, not streaming");
      if (device != "cpu") throw sq::UsageError("--sensitivity runs on the CPU only (--device cpu)");
      if (!kv.empty() || kv_group >= 0 || kv_sink >= 0 || !kv_keys.empty())
        throw sq::UsageError("--sensitivity measures weight/activation quantization with an FP32 KV cache: leave out --kv options");
    }
    const bool on_cuda = sq::select_device(device) == sq::Device::Cuda;  // throws first when CUDA is missing
    sq::apply_thread_option(threads, "sq-eval");
    const bool streaming = protocol == "streaming";
    if (!streaming && (app.count("--kv-policy") || app.count("--segment") || app.count("--max-tokens") || app.count("--batch-size")))
      throw sq::UsageError("--kv-policy, --segment, --max-tokens and -b/--batch-size need --protocol streaming");
    if (batch > 1 && w4_act == "int8")
      throw sq::UsageError("-b " + std::to_string(batch) + " runs blocks of tokens as prefill, where --w4a16-act int8 does not apply; use -b 1");
    if (streaming && app.count("--chunks")) throw sq::UsageError("--chunks does not apply to --protocol streaming (use --max-tokens)");
    const sq::KVPolicy policy = sq::parse_kv_policy(policy_text);
    sq::PerplexityOptions opt;
    if (!streaming) opt.protocol = sq::parse_protocol(protocol);
    if (app.count("--chunks") && chunks < 1)  // 0 meant "all" before: a careless value, not a request for everything
      throw sq::UsageError("--chunks must be at least 1 (omit it to evaluate every chunk), got " + std::to_string(chunks));
    opt.max_chunks = chunks;
    if (app.count("--max-tokens") && max_tokens < 1)  // as --chunks: 0 would silently mean "all"
      throw sq::UsageError("--max-tokens must be at least 1 (omit it to use every token), got " + std::to_string(max_tokens));

    if (ctx < 0 || (ctx > 0 && ctx < 2)) throw sq::UsageError("-c must be at least 2, got " + std::to_string(ctx));
    if (!streaming && opt.protocol == sq::PplProtocol::LlamaCpp && ctx > 0 && ctx < 3)
      throw sq::UsageError("-c " + std::to_string(ctx) +
                           " with --protocol llamacpp scores no token (it scores positions c/2 .. c-2 of each chunk); use -c 3 or more");
    // Pre-tokenized input is read (and its syntax checked) before the model is loaded.
    std::vector<int32_t> tokens = from_ids ? sq::read_token_ids_file(ids_path) : std::vector<int32_t>{};
    if (w4_act == "int8" && !streaming) throw sq::UsageError("--w4a16-act int8 changes decode steps only: use it with --protocol streaming");
    if (w4_act == "int8" && on_cuda) throw sq::UsageError("--w4a16-act int8 runs on the CPU only; drop --device cuda");
    // Layer-major evaluation (eval/layer_major.h) applies to the perplexity protocols on the CPU.
    const bool layer_major_possible = !streaming && !task_mode && !sensitivity && !on_cuda;
    if (layer_major && !layer_major_possible)
      throw sq::UsageError("--layer-major applies to --protocol windows or llamacpp on the CPU, without --task or --sensitivity");
    bool stream_model = false, stream_ref = false;
    if (!on_cuda) {  // the peak estimate, before anything is loaded
      const sq::ModelFootprint fp = sq::model_footprint(model_path);
      std::optional<sq::ModelFootprint> ref_fp;
      if (with_reference) ref_fp = sq::model_footprint(reference_path);
      const int64_t window = ctx > 0 ? ctx : std::min(512, fp.config.max_seq_len);
      const sq::MemoryBudget budget = sq::current_memory_budget();
      const std::string what = "sq-eval of " + model_path + (with_reference ? " with --reference-model" : "");
      const std::string hint = with_reference ? "compare with --reference-ppl instead, or use fewer threads (-t 1)" : "use fewer threads (-t 1)";
      const sq::MemoryEstimate whole = sq::estimate_eval(fp, ref_fp ? &*ref_fp : nullptr, window, sq::threads::max_threads());
      auto fits = [&](const sq::MemoryEstimate& e) {
        try {
          sq::check_memory_fits(e, budget, what);
          return true;
        } catch (const sq::MemoryLimitError&) {
          return false;
        }
      };
      // A model is read layer by layer when asked (any format but .sqm: LayerStream loads the others
      // whole and hands out their resident layers), or by itself when whole models do not fit and it
      // is a Hugging Face checkpoint or GGUF file (the formats LayerStream reads from disk one layer at a time).
      const bool auto_switch = !layer_major && layer_major_possible && !fits(whole) &&
                               (sq::streams_layers(fp) || (ref_fp && sq::streams_layers(*ref_fp)));
      if (layer_major || auto_switch) {
        stream_model = fp.format != "sqm" && (layer_major || sq::streams_layers(fp));
        stream_ref = with_reference && (layer_major || sq::streams_layers(*ref_fp));
      }
      if (stream_model || stream_ref) {
        // The hidden states of a group of chunks: at most 1 GiB (evaluate_perplexity_layer_major's
        // group), and no more than the text's tokens (bounded by its bytes) or --chunks windows hold.
        std::error_code ec;  // a missing text is reported when it is read
        const uintmax_t text_bytes = from_ids ? 0 : std::filesystem::file_size(text_path, ec);
        int64_t tokens_bound = from_ids ? int64_t(tokens.size()) : ec ? window : int64_t(text_bytes);
        if (app.count("--chunks")) tokens_bound = std::min<int64_t>(tokens_bound, chunks * window);
        const int64_t widest = std::max<int64_t>(fp.config.dim, ref_fp ? ref_fp->config.dim : 0);
        const int64_t group_hidden = std::min<int64_t>(int64_t(1) << 30, 4 * widest * std::max<int64_t>(tokens_bound, window));
        sq::check_memory_fits(
            sq::estimate_eval_layer_major(fp, stream_model, ref_fp ? &*ref_fp : nullptr, stream_ref, window, group_hidden), budget,
            what + " (layer-major)", hint);
        if (auto_switch)
          std::fprintf(stderr, "sq-eval: the whole model%s would not fit in memory (%s): evaluating layer by layer (--layer-major)\n",
                       with_reference ? "s" : "", whole.describe().c_str());
      }
      else
        sq::check_memory_fits(whole, budget, what, hint);
    }
    // The model under test: resident, or a layer stream (its globals; layers read during the evaluation).
    std::unique_ptr<sq::LayerStream> model_stream, ref_stream;
    sq::LoadedModel loaded_whole;
    if (stream_model) model_stream = std::make_unique<sq::LayerStream>(model_path);
    else loaded_whole = sq::load_model(model_path);
    const sq::LoadedModel& loaded = model_stream ? model_stream->model() : loaded_whole;
    const sq::ModelConfig& cfg = loaded.model->config();
    sq::apply_w4a16_act_option(*loaded.model, w4_act, model_path);
    // Token ids need no tokenizer; llamacpp asks the model's tokenizer, when it has one, whether it adds BOS.
    const bool need_tokenizer = !from_ids || (!streaming && opt.protocol == sq::PplProtocol::LlamaCpp);
    std::unique_ptr<sq::Tokenizer> tokenizer;
    if (need_tokenizer)
      tokenizer = from_ids ? sq::open_tokenizer_if_any(loaded, tokenizer_path) : sq::open_tokenizer_for(loaded, tokenizer_path);
    opt.ctx = ctx > 0 ? ctx : std::min(512, cfg.max_seq_len);
    if (ctx < 0 || (ctx > 0 && ctx < 2)) throw sq::UsageError("-c must be at least 2, got " + std::to_string(ctx));
    if (!streaming && opt.ctx > cfg.max_seq_len && !allow_long)
      throw sq::UsageError("-c " + std::to_string(opt.ctx) + " exceeds the model's trained context of " +
                           std::to_string(cfg.max_seq_len) + " tokens (use --allow-long-context to force)");
    if (!streaming && opt.ctx > cfg.max_seq_len && cfg.spec.position == sq::PositionKind::Learned)
      throw sq::UsageError("-c " + std::to_string(opt.ctx) + ": model '" + cfg.architecture + "' has learned absolute positions for " +
                           std::to_string(cfg.max_seq_len) + " tokens only; --allow-long-context cannot extend a learned position table");

    // The reference: same vocabulary; it runs on the CPU, dense, with an FP32 KV cache.
    sq::LoadedModel reference_whole;
    if (with_reference && stream_ref) ref_stream = std::make_unique<sq::LayerStream>(reference_path);
    else if (with_reference) reference_whole = sq::load_model(reference_path);
    const sq::LoadedModel& reference = ref_stream ? ref_stream->model() : reference_whole;
    if (with_reference) {
      const sq::ModelConfig& rc = reference.model->config();
      if (rc.vocab_size != cfg.vocab_size)
        throw sq::UsageError("--reference-model " + reference_path + " has a vocabulary of " + std::to_string(rc.vocab_size) +
                             " tokens, the model under test " + std::to_string(cfg.vocab_size) + ": they must be equal");
      if (!streaming && opt.ctx > rc.max_seq_len && (!allow_long || rc.spec.position == sq::PositionKind::Learned))
        throw sq::UsageError("-c " + std::to_string(opt.ctx) + " exceeds the reference model's trained context of " +
                             std::to_string(rc.max_seq_len) + " tokens" +
                             (rc.spec.position == sq::PositionKind::Learned ? " (learned positions)" : " (use --allow-long-context to force)"));
      opt.reference = reference.model.get();
    }
    if (sensitivity && loaded.format == "sqm")
      throw sq::UsageError("--sensitivity needs an FP32 model (llama2.c, GGUF or Hugging Face checkpoint), not the quantized .sqm " +
                           model_path);
    const sq::KVQuantization kvq = sq::select_kv_format(loaded.kv, loaded.format == "sqm", kv, kv_group, kv_sink, kv_keys, cfg);
    opt.kv = kvq.spec;
    opt.kv_params = &kvq.params;

    // Names every broken quality gate on stderr; the exit status (3 when one is broken).
    auto finish = [&](const std::vector<std::string>& broken) {
      for (const std::string& b : broken) std::fprintf(stderr, "sq-eval: quality gate: %s\n", b.c_str());
      return broken.empty() ? int(sq::kExitOk) : int(sq::kExitGate);
    };
    if (task_mode) {  // HellaSwag accuracy (eval/hellaswag.h, docs/protocols.md "HellaSwag")
      const std::vector<sq::HellaswagTask> all = sq::read_hellaswag_tasks(text_path);
      const std::vector<sq::HellaswagTask> chosen = sq::select_hellaswag_tasks(all, task_count, order);
      std::vector<sq::HellaswagSequences> seqs;
      seqs.reserve(chosen.size());
      const bool bos = tokenizer->default_add_bos();
      for (const sq::HellaswagTask& t : chosen)
        seqs.push_back(sq::tokenize_hellaswag_task(
            t, [&](const std::string& x) { return tokenizer->encode(x, bos, /*add_eos=*/false); }, text_path));
      sq::HellaswagOptions ho;
      ho.kv = opt.kv;
      ho.kv_params = opt.kv_params;
      ho.reference = opt.reference;
      sq::ProgressBar tbar("sq-eval", static_cast<int64_t>(seqs.size()), "tasks", !quiet);
      ho.on_progress = [&](int64_t done, int64_t, int64_t toks) { tbar.update(done, static_cast<double>(toks), "tok"); };
      const sq::HellaswagResult r = sq::evaluate_hellaswag(*loaded.model, seqs, ho);
      tbar.finish();
      std::fprintf(out, "model     %s (%s, %lld parameters), KV cache %s\n", model_path.c_str(), loaded.format.c_str(),
                   static_cast<long long>(cfg.parameter_count()), sq::kv_spec_name(opt.kv).c_str());
      std::fprintf(out, "task      hellaswag %s: %lld of %zu tasks (%s order), mean log-probability per ending (acc_norm)\n",
                   text_path.c_str(), static_cast<long long>(r.tasks_scored), all.size(), sq::task_order_name(order));
      std::fprintf(out, "accuracy  %.4f +/- %.4f (%lld correct; 95%% Wilson interval [%.4f, %.4f])\n", r.accuracy,
                   r.accuracy_stderr, static_cast<long long>(r.tasks_correct), r.ci95_low, r.ci95_high);
      std::fprintf(out, "speed     %s tokens/s (%lld tokens in %.2f s, %d threads)\n", sq::format_rate(r.tokens_per_second).c_str(),
                   static_cast<long long>(r.tokens_processed), r.seconds, sq::threads::max_threads());
      const sq::HellaswagComparison* c = r.comparison ? &*r.comparison : nullptr;
      if (c) {
        std::fprintf(out, "reference %s (%s; dense, FP32 KV cache): accuracy %.4f (change %+.4f)\n", reference_path.c_str(),
                     reference.format.c_str(), c->accuracy, r.accuracy - c->accuracy);
        std::fprintf(out, "choices   %lld of %lld tasks differ from the reference's\n", static_cast<long long>(c->changed_choices),
                     static_cast<long long>(r.tasks_scored));
        std::fprintf(out, "KLD       mean %.6f +/- %.6f, max %.6f over %lld ending tokens\n", c->kld_mean, c->kld_stderr,
                     c->kld_max, static_cast<long long>(c->predictions));
      }
      std::vector<std::string> broken;
      char buf[256];
      if (app.count("--min-accuracy") && r.accuracy < min_accuracy) {
        std::snprintf(buf, sizeof buf, "--min-accuracy %g: the accuracy is %.4f", min_accuracy, r.accuracy);
        broken.emplace_back(buf);
      }
      if (app.count("--max-accuracy-drop") && c && c->accuracy - r.accuracy > max_accuracy_drop) {
        std::snprintf(buf, sizeof buf, "--max-accuracy-drop %g: the accuracy dropped by %.4f (%.4f -> %.4f)", max_accuracy_drop,
                      c->accuracy - r.accuracy, c->accuracy, r.accuracy);
        broken.emplace_back(buf);
      }
      if (gates.max_kld && c && c->kld_mean > *gates.max_kld) {
        std::snprintf(buf, sizeof buf, "--max-kld %g: the mean KLD over the ending tokens is %.6f", *gates.max_kld, c->kld_mean);
        broken.emplace_back(buf);
      }
      if (!json_path.empty()) {
        nlohmann::json j;
        j["task"] = "hellaswag";
        j["accuracy"] = r.accuracy;
        j["accuracy_stderr"] = r.accuracy_stderr;
        j["accuracy_ci95"] = {r.ci95_low, r.ci95_high};
        j["tasks_scored"] = r.tasks_scored;
        j["tasks_correct"] = r.tasks_correct;
        j["task_order"] = sq::task_order_name(order);
        j["tokens_processed"] = r.tokens_processed;
        j["tokens_per_second"] = r.tokens_per_second;
        j["seconds"] = r.seconds;
        j["threads"] = sq::threads::max_threads();
        j["kv_cache"] = {{"format", sq::kv_spec_name(opt.kv)}, {"spec", sq::kv_spec_to_json(opt.kv)}};
        j["model"] = {{"path", model_path}, {"format", loaded.format}, {"parameter_count", cfg.parameter_count()}};
        j["tasks_file"] = {{"path", text_path}, {"tasks", all.size()}};
        if (c) {
          j["reference"] = {{"accuracy", c->accuracy},
                            {"model", {{"path", reference_path}, {"format", reference.format}}},
                            {"kv_cache", "fp32"}};
          j["changed_choices"] = c->changed_choices;
          j["kl_divergence"] = {{"mean", c->kld_mean}, {"stderr", c->kld_stderr}, {"max", c->kld_max},
                                {"predictions", c->predictions}};
        }
        if (app.count("--min-accuracy") || app.count("--max-accuracy-drop") || gates.max_kld) {
          nlohmann::json g;
          if (app.count("--min-accuracy")) g["min_accuracy"] = min_accuracy;
          if (app.count("--max-accuracy-drop")) g["max_accuracy_drop"] = max_accuracy_drop;
          if (gates.max_kld) g["max_kld"] = *gates.max_kld;
          g["passed"] = broken.empty();
          g["broken"] = broken;
          j["gates"] = g;
        }
        if (json_tasks) {
          nlohmann::json a = nlohmann::json::array();
          for (const sq::HellaswagTaskResult& t : r.tasks) {
            nlohmann::json e = {{"index", t.index}, {"gold", t.gold}, {"choice", t.choice}, {"correct", t.correct()},
                                {"scores", t.scores}};
            if (c) e["reference_choice"] = t.reference_choice;
            a.push_back(e);
          }
          j["tasks"] = a;
        }
        j["sqkit_version"] = SQ_VERSION;
        sq::write_json_report(json_path, j);
      }
      return finish(broken);
    }

    std::string text;
    nlohmann::json input_json;
    if (from_ids) {
      sq::check_token_ids_in_vocabulary(tokens, cfg.vocab_size, ids_path);
      opt.replace_first_with_bos = tokenizer && tokenizer->default_add_bos();
      input_json = {{"path", ids_path}, {"tokens", tokens.size()}};
    } else {
      text = sq::read_file_to_string(text_path);
      if (text.empty()) throw sq::InputError(text_path + ": the text file is empty");
      if (const std::string w = sq::text_encoding_warning(text, text_path); !w.empty())
        std::fprintf(stderr, "sq-eval: warning: %s\n", w.c_str());
      // BOS as the model's tokenizer adds it (SmolLM2: none), as llama.cpp does; the llamacpp protocol
      // then replaces each chunk's first token by BOS only for models that add one.
      const std::vector<int> ids = special ? tokenizer->encode_special(text, tokenizer->default_add_bos(), false)
                                           : tokenizer->encode(text, tokenizer->default_add_bos(), /*add_eos=*/false);
      opt.replace_first_with_bos = tokenizer->default_add_bos();
      tokens.assign(ids.begin(), ids.end());
      input_json = {{"path", text_path}, {"bytes", text.size()}, {"tokens", tokens.size()}};
    }
    const char* input_key = from_ids ? "token_ids" : "text";
    // The comparison with the reference (text and JSON), and the quality gates.
    auto print_comparison = [&](double ppl, const sq::ReferenceComparison& c) {
      const sq::ModelConfig& rc = reference.model->config();
      std::fprintf(out, "reference %s (%s, %lld parameters; dense, FP32 KV cache)\n", reference_path.c_str(),
                   reference.format.c_str(), static_cast<long long>(rc.parameter_count()));
      std::fprintf(out, "ref PPL   %.4f +/- %.5f (PPL ratio %.6f)\n", c.ppl_ref, c.ppl_ref_stderr, ppl / c.ppl_ref);
      std::fprintf(out, "KLD       mean %.6f +/- %.6f, median %.6f, p99 %.6f, p99.9 %.6f, max %.6f\n", c.kld_mean,
                   c.kld_stderr, c.kld_median, c.kld_p99, c.kld_p999, c.kld_max);
      std::fprintf(out, "top-1     %.6f agreement (%lld tokens)\n", c.top1_agreement, static_cast<long long>(c.tokens));
      std::fprintf(out, "delta-p   mean %+.6f, RMS %.6f (p_test - p_ref of the correct token)\n", c.delta_p_mean,
                   c.delta_p_rms);
    };
    auto comparison_json = [&](nlohmann::json& j, const sq::ReferenceComparison& c) {
      j["reference"] = {{"ppl", c.ppl_ref},
                        {"ppl_stderr", c.ppl_ref_stderr},
                        {"nll_mean", c.nll_ref_mean},
                        {"kv_cache", "fp32"},
                        {"model",
                         {{"path", reference_path},
                          {"format", reference.format},
                          {"parameter_count", reference.model->config().parameter_count()}}}};
      j["kl_divergence"] = {{"mean", c.kld_mean},     {"stderr", c.kld_stderr}, {"median", c.kld_median},
                            {"p99", c.kld_p99},       {"p999", c.kld_p999},     {"max", c.kld_max}};
      j["top1_agreement"] = c.top1_agreement;
      j["delta_p"] = {{"mean", c.delta_p_mean}, {"rms", c.delta_p_rms}};
    };
    // Gate results: computed before the JSON is written (it records them), reported after it.
    auto gate_results = [&](double ppl, const std::optional<sq::ReferenceComparison>& c) {
      const double ppl_ref = c ? c->ppl_ref : reference_ppl;
      return sq::broken_gates(gates, ppl, ppl_ref, c ? &*c : nullptr);
    };
    auto gates_json = [&](nlohmann::json& j, const std::vector<std::string>& broken) {
      if (!gates.any()) return;
      nlohmann::json g;
      if (gates.max_kld) g["max_kld"] = *gates.max_kld;
      if (gates.max_ppl_ratio) g["max_ppl_ratio"] = *gates.max_ppl_ratio;
      if (gates.min_top1) g["min_top1"] = *gates.min_top1;
      if (app.count("--reference-ppl")) g["reference_ppl"] = reference_ppl;
      g["passed"] = broken.empty();
      g["broken"] = broken;
      j["gates"] = g;
    };
    if (streaming && on_cuda)
      throw sq::UnsupportedError("--device cuda: --protocol streaming (KV eviction) runs on the CPU only; use --device cpu");
    if (streaming) {
      sq::StreamingOptions so;
      so.policy = policy;
      so.ctx = ctx;
      so.max_tokens = max_tokens;
      so.segment = segment;
      so.batch = batch;
      so.kv = opt.kv;
      so.kv_params = opt.kv_params;
      so.reference = opt.reference;
      const int64_t n = max_tokens > 0 ? std::min<int64_t>(max_tokens, int64_t(tokens.size())) : int64_t(tokens.size());
      sq::ProgressBar bar("sq-eval", ctx > 0 ? (n / ctx) * (ctx - 1) : n - 1, "tok", !quiet);
      so.on_progress = [&](int64_t done, int64_t) { bar.update(done); };
      const sq::StreamingResult r = sq::evaluate_streaming(*loaded.model, tokens, so);
      bar.finish();
      sq::check_scored_result(r.tokens_scored, r.ppl, input_path);
      std::fprintf(out, "model     %s (%s, %lld parameters)\n", model_path.c_str(), loaded.format.c_str(),
                  static_cast<long long>(cfg.parameter_count()));
      std::fprintf(out, "protocol  streaming, kv-policy %s, %lld stream(s) of %lld tokens, %lld tokens scored\n",
                  sq::kv_policy_name(sq::resolve_kv_policy(policy, r.stream_length)).c_str(), static_cast<long long>(r.streams),
                  static_cast<long long>(r.stream_length), static_cast<long long>(r.tokens_scored));
      std::fprintf(out, "PPL       %.4f\n", r.ppl);
      std::fprintf(out, "KV cache  %s: peak %lld bytes (%lld tokens)\n", sq::kv_spec_name(opt.kv).c_str(),
                  static_cast<long long>(r.peak_kv_bytes), static_cast<long long>(r.peak_kv_rows));
      std::fprintf(out, "speed     %s tokens/s (%.2f s, %d threads)\n", sq::format_rate(r.tokens_per_second).c_str(), r.seconds, sq::threads::max_threads());
      std::fprintf(out, "segments  (stream positions, PPL, KV bytes at segment end)\n");
      for (size_t i = 0; i < r.segment_ppl.size(); ++i)
        std::fprintf(out, "  %7lld-%-7lld %10.4f %12lld\n", static_cast<long long>(int64_t(i) * segment),
                    static_cast<long long>(int64_t(i) * segment + r.segment_tokens[i] / r.streams - 1), r.segment_ppl[i],
                    static_cast<long long>(i < r.segment_kv_bytes.size() ? r.segment_kv_bytes[i] : 0));
      if (r.comparison) print_comparison(r.ppl, *r.comparison);
      const std::vector<std::string> broken = gate_results(r.ppl, r.comparison);
      if (!json_path.empty()) {
        nlohmann::json j;
        j["ppl"] = r.ppl;
        j["nll_mean"] = r.nll_mean;
        j["tokens_scored"] = r.tokens_scored;
        j["tokens_per_second"] = r.tokens_per_second;
        j["seconds"] = r.seconds;
        j["threads"] = sq::threads::max_threads();
        j["protocol"] = {{"name", "streaming"},
                         {"kv_policy", sq::kv_policy_name(sq::resolve_kv_policy(policy, r.stream_length))},
                         {"streams", r.streams},
                         {"stream_length", r.stream_length},
                         {"segment", segment},
                         {"batch_size", batch}};
        j["kv_cache"] = {{"format", sq::kv_spec_name(opt.kv)}, {"spec", sq::kv_spec_to_json(opt.kv)},
                         {"peak_bytes", r.peak_kv_bytes}, {"peak_tokens", r.peak_kv_rows}};
        nlohmann::json segs = nlohmann::json::array();
        for (size_t i = 0; i < r.segment_ppl.size(); ++i)
          segs.push_back({{"first", int64_t(i) * segment},
                          {"tokens", r.segment_tokens[i]},
                          {"ppl", r.segment_ppl[i]},
                          {"kv_bytes", i < r.segment_kv_bytes.size() ? r.segment_kv_bytes[i] : 0}});
        j["segments"] = segs;
        j["model"] = {{"path", model_path}, {"format", loaded.format}, {"parameter_count", cfg.parameter_count()}};
        j[input_key] = input_json;
        if (r.comparison) comparison_json(j, *r.comparison);
        gates_json(j, broken);
        j["sqkit_version"] = SQ_VERSION;
        sq::write_json_report(json_path, j);
      }
      return finish(broken);
    }
    if (sq::perplexity_chunks(static_cast<int64_t>(tokens.size()), opt) == 0)
      throw sq::InputError(input_path + ": too short: " + std::to_string(tokens.size()) + " tokens, need at least " +
                           std::to_string(opt.ctx) + " for one chunk of -c " + std::to_string(opt.ctx));

    if (sensitivity) {
      const sq::LoadedModel fp32 = sq::load_model(model_path);  // the reference: never modified
      const bool by_layer = sensitivity_by != "kind", by_kind = sensitivity_by != "layer";
      const int units = (by_layer ? cfg.n_layers : 0) + (by_kind ? 7 : 0);
      sq::ProgressBar sbar("sq-eval", units, "units", !quiet);
      const sq::SensitivityResult sr = sq::evaluate_sensitivity(*loaded.model, *fp32.model, tokens, opt, sens_scheme, by_layer,
                                                                by_kind, [&](int done, int) { sbar.update(done); });
      sbar.finish();
      std::fprintf(out, "model     %s (%s, %lld parameters), FP32 PPL %.4f\n", model_path.c_str(), loaded.format.c_str(),
                   static_cast<long long>(cfg.parameter_count()), sr.ppl_ref);
      std::fprintf(out, "protocol  %s, ctx %d, %lld tokens scored; one unit quantized %s at a time (%.1f s, %d threads)\n",
                   sq::protocol_name(opt.protocol), opt.ctx, static_cast<long long>(sr.tokens_scored),
                   sq::sensitivity_scheme_name(sens_scheme), sr.seconds, sq::threads::max_threads());
      auto table = [&](const char* title, const std::vector<sq::SensitivityRow>& rows) {
        if (rows.empty()) return;
        std::fprintf(out, "%-10s %7s %12s %12s %10s %12s %12s\n", title, "linears", "KLD mean", "KLD p99", "top-1", "PPL",
                     "dPPL");
        for (const sq::SensitivityRow& r : rows)
          std::fprintf(out, "%-10s %7d %12.6f %12.6f %10.6f %12.4f %+12.4f\n", r.unit.c_str(), r.linears, r.kld_mean,
                       r.kld_p99, r.top1_agreement, r.ppl, r.delta_ppl);
      };
      table("layer", sr.layers);
      table("kind", sr.kinds);
      if (!json_path.empty()) {
        auto rows_json = [](const std::vector<sq::SensitivityRow>& rows) {
          nlohmann::json a = nlohmann::json::array();
          for (const sq::SensitivityRow& r : rows) {
            nlohmann::json e = {{"linears", r.linears},   {"kld_mean", r.kld_mean}, {"kld_p99", r.kld_p99},
                                {"top1_agreement", r.top1_agreement}, {"ppl", r.ppl}, {"delta_ppl", r.delta_ppl}};
            if (r.layer >= 0) e["layer"] = r.layer; else e["kind"] = r.kind;
            a.push_back(e);
          }
          return a;
        };
        nlohmann::json j;
        j["sensitivity"] = {{"scheme", sq::sensitivity_scheme_name(sens_scheme)}, {"ppl_fp32", sr.ppl_ref},
                            {"tokens_scored", sr.tokens_scored}, {"seconds", sr.seconds},
                            {"layers", rows_json(sr.layers)}, {"kinds", rows_json(sr.kinds)}};
        j["protocol"] = {{"name", sq::protocol_name(opt.protocol)}, {"ctx", opt.ctx}};
        j["model"] = {{"path", model_path}, {"format", loaded.format}, {"parameter_count", cfg.parameter_count()}};
        j[input_key] = input_json;
        j["sqkit_version"] = SQ_VERSION;
        sq::write_json_report(json_path, j);
      }
      return int(sq::kExitOk);
    }
    sq::ProgressBar bar("sq-eval", sq::perplexity_chunks(static_cast<int64_t>(tokens.size()), opt), "chunks", !quiet);
    opt.on_progress = [&](int64_t done, int64_t, int64_t toks) { bar.update(done, static_cast<double>(toks), "tok"); };
    std::unique_ptr<sq::CudaDecoder> gpu;
    if (on_cuda) gpu = std::make_unique<sq::CudaDecoder>(*loaded.model);  // uploads; refuses unsupported layers
    // A chunk with non-finite logits on the device is re-run layer by layer on the CPU to name the layer.
    opt.locate_nonfinite = [&](const int32_t* input, int) { return sq::locate_nonfinite_chunk(*loaded.model, input, opt); };
    const sq::EvalModel test_side{model_stream ? nullptr : loaded.model.get(), model_stream.get()};
    const sq::EvalModel ref_side{ref_stream ? nullptr : reference.model.get(), ref_stream.get()};
    const sq::PerplexityResult r =
        gpu ? sq::evaluate_perplexity_cuda(*gpu, tokens, opt)
        : (model_stream || ref_stream)
            ? sq::evaluate_perplexity_layer_major(test_side, with_reference ? &ref_side : nullptr, tokens, opt)
            : sq::evaluate_perplexity(*loaded.model, tokens, opt);
    bar.finish();
    sq::check_scored_result(r.tokens_scored, r.ppl, input_path);
    const std::string device_desc = on_cuda ? "cuda (" + sq::cuda_device_name() + ")" : "cpu";

    std::fprintf(out, "model     %s (%s, %lld parameters)\n", model_path.c_str(), loaded.format.c_str(),
                static_cast<long long>(cfg.parameter_count()));
    std::fprintf(out, "protocol  %s, ctx %d, %lld chunks, %lld tokens scored\n", sq::protocol_name(opt.protocol), opt.ctx,
                static_cast<long long>(r.chunks), static_cast<long long>(r.tokens_scored));
    std::fprintf(out, "PPL       %.4f +/- %.5f\n", r.ppl, r.ppl_stderr);
    const int64_t kvw = int64_t(cfg.n_kv_heads) * cfg.head_dim;
    const double kv_theory = double(cfg.n_layers) * double(sq::kv_row_bytes(opt.kv, kvw, cfg.head_dim, false) +
                                                           sq::kv_row_bytes(opt.kv, kvw, cfg.head_dim, true));
    std::fprintf(out, "KV cache  %s: %.2f bytes/token (dense %.2f, sinks %.2f, outliers %.2f, tables %.2f; FP32 %.0f)\n",
                sq::kv_spec_name(opt.kv).c_str(), r.kv_bytes_per_token, r.kv_dense_bytes_per_token, r.kv_sink_bytes_per_token,
                r.kv_outlier_bytes_per_token, r.kv_table_bytes_per_token, double(cfg.n_layers) * 8.0 * double(kvw));
    if (on_cuda)
      std::fprintf(out, "speed     %s tokens/s (%lld tokens in %.2f s, %s)\n", sq::format_rate(r.tokens_per_second).c_str(),
                  static_cast<long long>(r.tokens_processed), r.seconds, device_desc.c_str());
    else
      std::fprintf(out, "speed     %s tokens/s (%lld tokens in %.2f s, %d threads)\n", sq::format_rate(r.tokens_per_second).c_str(),
                  static_cast<long long>(r.tokens_processed), r.seconds, sq::threads::max_threads());
    if (r.comparison) print_comparison(r.ppl, *r.comparison);
    const std::vector<std::string> broken = gate_results(r.ppl, r.comparison);

    if (!json_path.empty()) {
      nlohmann::json j;
      j["ppl"] = r.ppl;
      j["ppl_stderr"] = r.ppl_stderr;
      j["nll_mean"] = r.nll_mean;
      j["tokens_scored"] = r.tokens_scored;
      j["tokens_processed"] = r.tokens_processed;
      j["tokens_per_second"] = r.tokens_per_second;
      j["seconds"] = r.seconds;
      j["threads"] = sq::threads::max_threads();
      j["device"] = device_desc;
      j["kv_cache"] = {{"format", sq::kv_spec_name(opt.kv)},
                       {"spec", sq::kv_spec_to_json(opt.kv)},
                       {"bytes_per_token", r.kv_bytes_per_token},
                       {"dense_bytes_per_token", r.kv_dense_bytes_per_token},
                       {"sink_bytes_per_token", r.kv_sink_bytes_per_token},
                       {"outlier_bytes_per_token", r.kv_outlier_bytes_per_token},
                       {"table_bytes_per_token", r.kv_table_bytes_per_token},
                       {"dense_bytes_per_token_theoretical", kv_theory},
                       {"fp32_bytes_per_token", double(cfg.n_layers) * 8.0 * double(kvw)}};
      j["protocol"] = {{"name", sq::protocol_name(opt.protocol)}, {"ctx", opt.ctx}, {"chunks", r.chunks}};
      j["layer_major"] = {{"model", model_stream != nullptr}, {"reference", ref_stream != nullptr}};
      j["model"] = {{"path", model_path}, {"format", loaded.format}, {"parameter_count", cfg.parameter_count()}};
      j[input_key] = input_json;
      if (r.comparison) comparison_json(j, *r.comparison);
      gates_json(j, broken);
      j["sqkit_version"] = SQ_VERSION;
      sq::write_json_report(json_path, j);
    }
    return finish(broken);
  });
}
