// sq-run: generate text with a model. stdout carries only the prompt and the generated text; with
// --token-ids, the generated ids on one line, then (when the model has a tokenizer) prompt and text.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/memory_budget.h"
#include "core/progress.h"
#include "core/tool_main.h"
#include "cuda/cuda_eval.h"
#include "cuda/cuda_runtime.h"
#include "cuda/device.h"
#include "formats/mapped_file.h"
#include "formats/npy_file.h"
#include "formats/token_ids_file.h"
#include "formats/tokenizer.h"
#include "formats/utf8.h"
#include "model/memory_estimate.h"
#include "model/model_loader.h"
#include "model/quantize_in_memory.h"
#include "runtime/generator.h"
#include "tool_cli.h"

int main(int argc, char** argv) {
  CLI::App app{"sq-run: generate text with a model (prompt and generated text on stdout; logs and speed on stderr).\n"
               "With --token-ids: stdout has the generated ids on one line (space-separated), then, when the model has a "
               "tokenizer, the prompt and generated text decoded."};
  std::string model_path, tokenizer_path, prompt, prompt_file, ids_path, logits_path, json_path;
  bool force = false;
  int64_t n = 256;
  int threads = 0;
  bool quiet = false;
  sq::SamplerOptions so;
  so.temperature = 1.0f;
  so.top_p = 0.9f;
  app.add_option("-m,--model", model_path, "Model: llama2.c .bin, GGUF file or Hugging Face checkpoint directory")->required();
  app.add_option("--tokenizer", tokenizer_path, "Tokenizer (tokenizer.bin, tokenizer.model, tokenizer.json, GGUF model or directory); default: the model's own");
  auto* prompt_opt = app.add_option("-p,--prompt", prompt, "Prompt text");
  auto* file_opt = app.add_option("-f,--file", prompt_file, "Read the prompt from this file (UTF-8; as llama.cpp's -f)");
  prompt_opt->excludes(file_opt);
  app.add_option("--token-ids", ids_path,
                 "The prompt as token ids instead of text: whitespace-separated non-negative integers or a JSON array, used "
                 "exactly as given (no BOS added; no tokenizer needed)")
      ->type_name("FILE");
  app.add_option("-n,--n-predict", n, "Number of tokens to generate")->capture_default_str();
  app.add_option("--logits", logits_path,
                 "Write the prompt's logits (one forward pass over every prompt token, FP32 cache) as a NumPy .npy "
                 "float32 array [prompt tokens, vocab], for comparisons with other implementations; -n 0 stops there")
      ->type_name("FILE.npy");
  app.add_flag("--force", force, "Replace an existing --logits file");
  app.add_option("--temp", so.temperature, "Sampling temperature; 0 = greedy")->capture_default_str();
  app.add_option("--top-k", so.top_k, "Top-k sampling; 0 = off")->capture_default_str();
  app.add_option("--top-p", so.top_p, "Nucleus sampling threshold in (0, 1]")->capture_default_str();
  app.add_option("-s,--seed", so.seed, "RNG seed")->capture_default_str();
  app.add_option("-t,--threads", threads, sq::kThreadsHelp);
  app.add_flag("-q,--quiet", quiet, "No statistics on stderr");
  std::string policy = "dense", kv, kv_keys;
  int kv_group = -1, kv_sink = -1;
  sq::GenerationOptions go;
  app.add_option("--kv-policy", policy,
                 "KV cache policy: dense (stop at the model's context) | window:W | sink:S,window:W | h2o:B,recent:R | "
                 "qhitter:B,recent:R,lambda:L (constant memory, generate as long as asked)")
      ->capture_default_str();
  app.add_option("--kv", kv, "KV-cache format: fp32 | int8 | int4 | int3 | int2 | nuq4 | nuq3 | nuq2 (default: the model file's)");
  app.add_option("--kv-group", kv_group, "Uniform KV formats: channels per scale/zero-point group (default: head_dim)");
  app.add_option("--kv-sink-fp16", kv_sink, "Keep the first N tokens' K/V in FP16");
  app.add_option("--kv-keys", kv_keys, "Store keys pre-rope | post-rope (RoPE models only)");
  app.add_flag("--ignore-eos", go.ignore_eos, "Do not stop at end-of-text tokens");
  std::string w4_act;
  sq::add_w4a16_act_option(app, w4_act, "the prompt's prefill stays FP32");
  std::string device = "cpu";
  app.add_option("--device", device, "cpu | cuda (CUDA: needs a build with SQ_WITH_CUDA and a device; docs/cuda.md)")
      ->capture_default_str();
  bool special = false;
  app.add_flag("--special", special,
               "Parse special-token text in the prompt (e.g. <|im_start|>, a chat template's markers) into its token id; "
               "without it such text is tokenized as plain characters");
  sq::add_json_option(app, json_path,
                      "The run's figures: prompt and generated tokens, prefill and decode time and tokens/s, the generated ids "
                      "and text, the KV cache's peak bytes, peak_rss_bytes (with -: the text goes to stderr)");
  sq::add_version_flag(app, "sq-run");
  if (const int status = sq::parse_tool_args(app, "sq-run", argc, argv); status >= 0) return status;

  return sq::run_tool("sq-run", [&]() {
    const bool on_cuda = sq::select_device(device) == sq::Device::Cuda;  // throws first when CUDA is missing
    if (!json_path.empty() && json_path != "-")
      sq::check_output_path("--json", json_path, true, {model_path, tokenizer_path, prompt_file, ids_path, logits_path});
    sq::StdoutToStderr redirect(json_path == "-");  // stdout is the report's alone
    sq::apply_thread_option(threads, "sq-run");
    if (n < 0) throw sq::UsageError("-n must be >= 0, got " + std::to_string(n));
    const bool from_ids = app.count("--token-ids") > 0;
    const bool from_text = app.count("--prompt") > 0 || app.count("--file") > 0;
    if (from_ids && from_text) throw sq::UsageError("give either the prompt text (-p TEXT or -f FILE) or --token-ids FILE, not both");
    if (from_ids && special) throw sq::UsageError("--special parses prompt text; token ids (--token-ids) are used as given");
    if (!from_ids && !from_text) throw sq::UsageError("give the prompt with -p TEXT or -f FILE, or its token ids with --token-ids FILE");
    // Pre-tokenized input is read (and its syntax checked) before the model is loaded.
    std::vector<int32_t> prompt_tokens = from_ids ? sq::read_token_ids_file(ids_path) : std::vector<int32_t>{};
    if (!logits_path.empty()) {
      if (on_cuda) throw sq::UsageError("--logits runs on the CPU runner only; drop --device cuda");
      sq::check_output_path("--logits", logits_path, force, {model_path, tokenizer_path, prompt_file, ids_path});
    }
    if (app.count("--file")) {
      prompt = sq::read_file_to_string(prompt_file);
      if (prompt.empty()) throw sq::InputError(prompt_file + ": the prompt file is empty");
    }
    if (from_text)
      if (const std::string w = sq::text_encoding_warning(prompt, app.count("--file") ? prompt_file : "the prompt"); !w.empty())
        std::fprintf(stderr, "sq-run: warning: %s\n", w.c_str());
    sq::Sampler sampler(so);
    if (w4_act == "int8" && on_cuda) throw sq::UsageError("--w4a16-act int8 runs on the CPU runner only; drop --device cuda");
    if (!on_cuda) {  // the peak estimate, before anything is loaded (the weights of a CUDA run live on the device)
      const sq::ModelFootprint fp = sq::model_footprint(model_path);
      const int64_t positions = std::min<int64_t>(fp.config.max_seq_len, int64_t(prompt_tokens.size()) + int64_t(prompt.size()) + n);
      sq::check_memory_fits(sq::estimate_run(fp, std::max<int64_t>(positions, 1)), sq::current_memory_budget(), "sq-run of " + model_path);
    }
    sq::LoadedModel loaded = sq::load_model(model_path);
    sq::apply_w4a16_act_option(*loaded.model, w4_act, model_path);
    // Token ids need no tokenizer; the model's (or --tokenizer) is used, when there is one, to print the text too.
    std::unique_ptr<sq::Tokenizer> tokenizer =
        from_ids ? sq::open_tokenizer_if_any(loaded, tokenizer_path) : sq::open_tokenizer_for(loaded, tokenizer_path);
    if (from_ids) {
      sq::check_token_ids_in_vocabulary(prompt_tokens, loaded.model->config().vocab_size, ids_path);
    } else {
      const std::vector<int> ids = special ? tokenizer->encode_special(prompt, tokenizer->default_add_bos(), false)
                                           : tokenizer->encode(prompt, tokenizer->default_add_bos(), /*add_eos=*/false);
      prompt_tokens.assign(ids.begin(), ids.end());
      std::fputs(prompt.c_str(), stdout);
      std::fflush(stdout);
    }
    const int64_t context = loaded.model->config().max_seq_len;
    if (!logits_path.empty()) {
      // The reference forward of the whole prompt: what transformers' model(ids).logits computes.
      const int64_t t = static_cast<int64_t>(prompt_tokens.size());
      if (t == 0) throw sq::InputError("--logits: the prompt has no tokens");
      if (t > context)
        throw sq::UsageError("--logits: the prompt has " + std::to_string(t) + " tokens, more than the model's context of " +
                             std::to_string(context));
      const int64_t vocab = loaded.model->config().vocab_size;
      sq::KVCache cache(loaded.model->config(), t);
      sq::Workspace ws;
      std::vector<float> logits(static_cast<size_t>(t * vocab));
      loaded.model->forward(prompt_tokens.data(), t, cache, ws, logits.data(), sq::LogitsFor::AllTokens);
      sq::write_npy_f32(logits_path, {t, vocab}, logits);
      if (!quiet) std::fprintf(stderr, "sq-run: wrote logits [%lld, %lld] to %s\n", static_cast<long long>(t),
                               static_cast<long long>(vocab), logits_path.c_str());
      if (n == 0) {
        redirect.restore();
        if (!json_path.empty())
          sq::write_json_report(json_path, nlohmann::ordered_json{{"model", model_path}, {"prompt_tokens", t}, {"logits", logits_path}});
        return sq::kExitOk;
      }
    }
    go.policy = sq::parse_kv_policy(policy);
    const sq::KVQuantization kvq = sq::select_kv_format(loaded.kv, loaded.format == "sqm", kv, kv_group, kv_sink, kv_keys, loaded.model->config());
    go.kv = kvq.spec;
    go.kv_params = &kvq.params;
    std::string generated_text;  // decoded: printed after the ids (--token-ids) and the --json report's text
    std::vector<int32_t> generated_ids;
    const auto print_token = [&](int32_t prev, int32_t tok) {
      generated_ids.push_back(tok);
      const std::string piece = tokenizer ? tokenizer->decode_token(prev, tok) : std::string();
      generated_text += piece;
      if (from_ids)
        std::fprintf(stdout, generated_ids.size() > 1 ? " %d" : "%d", static_cast<int>(tok));
      else
        std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };
    std::unique_ptr<sq::CudaDecoder> gpu;
    if (on_cuda) gpu = std::make_unique<sq::CudaDecoder>(*loaded.model);  // uploads; refuses unsupported layers
    const sq::GenerationStats st = gpu ? sq::generate_cuda(*gpu, prompt_tokens, n, context, sampler, print_token, go)
                                       : sq::generate(*loaded.model, prompt_tokens, n, context, sampler, print_token, go);
    std::fputc('\n', stdout);
    if (from_ids && tokenizer) {
      const std::string text = tokenizer->decode(std::vector<int>(prompt_tokens.begin(), prompt_tokens.end())) + generated_text;
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fputc('\n', stdout);
    }
    std::fflush(stdout);
    if (!quiet) {
      if (st.hit_context_limit)
        std::fprintf(stderr, "sq-run: stopped at the model's context of %lld tokens\n", static_cast<long long>(context));
      std::fprintf(stderr, "sq-run: prompt %lld tokens in %.3f s (%s tok/s); generated %lld tokens in %.3f s (%s tok/s)\n",
                   static_cast<long long>(st.prompt_tokens), st.prefill_seconds,
                   sq::format_rate(st.prefill_seconds > 0 ? st.prompt_tokens / st.prefill_seconds : 0.0).c_str(),
                   static_cast<long long>(st.generated_tokens), st.decode_seconds,
                   sq::format_rate(st.decode_seconds > 0 ? st.generated_tokens / st.decode_seconds : 0.0).c_str());
      if (on_cuda) std::fprintf(stderr, "sq-run: device cuda (%s)\n", sq::cuda_device_name().c_str());
      std::fprintf(stderr, "sq-run: KV cache %s, policy %s: peak %lld bytes (%lld tokens)\n", sq::kv_spec_name(go.kv).c_str(),
                   sq::kv_policy_name(go.policy).c_str(), static_cast<long long>(st.peak_kv_bytes),
                   static_cast<long long>(st.peak_kv_tokens));
    }
    redirect.restore();
    if (!json_path.empty()) {
      nlohmann::ordered_json j;
      j["model"] = model_path;
      j["device"] = on_cuda ? "cuda" : "cpu";
      j["prompt_tokens"] = st.prompt_tokens;
      j["generated_tokens"] = st.generated_tokens;
      j["prefill_seconds"] = st.prefill_seconds;
      j["decode_seconds"] = st.decode_seconds;
      j["prefill_tokens_per_second"] = st.prefill_seconds > 0 ? st.prompt_tokens / st.prefill_seconds : 0.0;
      j["decode_tokens_per_second"] = st.decode_seconds > 0 ? st.generated_tokens / st.decode_seconds : 0.0;
      j["stopped_at"] = st.hit_context_limit ? "context" : st.hit_end_token ? "end_token" : "n_predict";
      j["generated_ids"] = generated_ids;
      if (tokenizer) j["text"] = generated_text;
      j["kv_cache"] = {{"format", sq::kv_spec_name(go.kv)},
                       {"policy", sq::kv_policy_name(go.policy)},
                       {"peak_bytes", st.peak_kv_bytes},
                       {"peak_tokens", st.peak_kv_tokens},
                       {"capacity_tokens", st.kv_capacity_tokens}};
      sq::write_json_report(json_path, j);
    }
    return sq::kExitOk;
  });
}
