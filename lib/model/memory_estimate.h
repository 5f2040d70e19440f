// Peak-memory estimates of the tools' work, made from a model's config and file sizes before any
// weight is loaded, and checked against the memory this process may use (core/memory_budget.h).
// The estimates are upper bounds of the resident set measured on real models (docs/reliability.md
// "Memory estimates"); they decide a refusal only when the work cannot fit.
#pragma once

#include <cstdint>
#include <string>

#include "core/memory_budget.h"
#include "core/model_config.h"

namespace sq {

/// What a model path holds, read without loading its weights (config and file sizes only).
struct ModelFootprint {
  ModelConfig config;
  std::string format;          ///< "llama2c", "hf-safetensors", "gguf", "sqm"
  int64_t file_bytes = 0;      ///< bytes of the model file(s), mapped while the model is used
  int64_t fp32_bytes = 0;      ///< 4 · parameter_count(): every weight as FP32
  int64_t linear_fp32_bytes = 0;  ///< 4 · (decoder linears + the LM head, tied or not): what gets a packed GEMM copy
  int64_t layer_fp32_bytes = 0;   ///< 4 · one decoder layer's parameters
  int64_t global_fp32_bytes = 0;  ///< 4 · (embedding + untied LM head + final norm): held by a layer stream
};

/// Whether LayerStream (model/layer_stream.h) reads this model from disk one layer at a time: a
/// Hugging Face directory or a GGUF file (a llama2.c file is loaded whole, a .sqm is not streamed).
inline bool streams_layers(const ModelFootprint& m) { return m.format == "hf-safetensors" || m.format == "gguf"; }

/// Reads `path`'s config and sizes: a GGUF's metadata (load_gguf_checkpoint checks it against the
/// tensors later), a Hugging Face directory's config.json checked against its safetensors headers
/// (HfCheckpointReader) and the sizes of its *.safetensors, a .sqm header (checksums not verified here), a llama2.c header.
/// Throws what the readers throw for a malformed header; InputError for an unrecognized path
/// (as load_model would, before it does).
ModelFootprint model_footprint(const std::string& path);

/// The model loaded whole for running it: a .sqm's tensors, read from the mapping or copied (≈ its file
/// size) or the FP32 weights (dequantized / widened, except a llama2.c or F32 file, whose weights
/// are views of the mapping) plus one packed copy of every linear for the FP32 GEMMs when the
/// linears hold at most kPrepackMaxModelBytes (model/linear.h; load_model's policy) and the CPU
/// makes such copies (ops::weight_matmul_pays(): AVX-512).
void add_loaded_model(MemoryEstimate& e, const ModelFootprint& m, const std::string& label = "model");

/// Running `tokens` positions at once with a KV cache of `kv_tokens` (FP32): logits [tokens, vocab],
/// activations and the cache, per `threads` concurrent windows.
/// `logits` false: layer-by-layer work that computes none (a streamed calibration).
void add_forward_buffers(MemoryEstimate& e, const ModelConfig& c, int64_t tokens, int64_t kv_tokens, int threads,
                         bool logits = true);

/// GPTQ Hessians of `layers` layers held at once: 12·(2d² + q² + h²) bytes per layer (calib/hessian.h:
/// the FP64 sums and the FP32 block product of each accumulator).
int64_t hessian_bytes(const ModelConfig& c, int layers);

/// sq-eval: `model` (and `reference`, when not null) loaded whole, `threads` windows of `ctx`
/// tokens in flight (perplexity protocols evaluate windows in parallel; streaming keeps a cache
/// of up to `ctx` tokens — pass the policy's bound or the text's length).
MemoryEstimate estimate_eval(const ModelFootprint& model, const ModelFootprint* reference, int64_t ctx, int threads);

/// sq-eval layer-major (eval/layer_major.h): each side whose `*_streamed` is set holds its global
/// tensors (embedding, LM head, final norm), one layer widened to FP32, and `group_hidden_bytes` of
/// hidden states; the other side is loaded whole. One chunk of `ctx` tokens is in flight per model.
MemoryEstimate estimate_eval_layer_major(const ModelFootprint& model, bool model_streamed, const ModelFootprint* reference,
                                         bool reference_streamed, int64_t ctx, int64_t group_hidden_bytes);

/// sq-run: the model loaded whole and one sequence of up to `tokens` positions (prompt + new tokens).
MemoryEstimate estimate_run(const ModelFootprint& model, int64_t tokens);

/// sq-calibrate: `streamed` (a Hugging Face directory read layer by layer): the global tensors,
/// one layer and its packed copies, one layer's Hessians; else the model loaded whole and every
/// layer's Hessians (`hessian`). Windows of `seq_len` tokens run on `threads` threads; `fisher`
/// adds the backward pass's saved activations of every layer.
MemoryEstimate estimate_calibrate(const ModelFootprint& model, bool streamed, bool hessian, bool fisher, int64_t seq_len, int threads);

/// sq-convert: `streamed`: the global tensors and one layer (FP32 and its quantized copy) at a
/// time; else the FP32 weights loaded whole (with packed copies when `runs_forward`: --alpha auto,
/// sequential GPTQ, --clip search). `gptq` adds one layer's Hessians and, with `runs_forward`,
/// the calibration windows' activations of `seq_len` tokens.
MemoryEstimate estimate_convert(const ModelFootprint& model, bool streamed, bool gptq, bool runs_forward, int64_t seq_len, int threads);

}  // namespace sq
