// Issue 19: speed of a real model (any file sqkit opens) in the shapes of llama.cpp's llama-bench
// (pp512 / tg128) and llama-perplexity, for FP32, W8A8 and W4A16 variants of the same weights,
// beside the sgemm-bound time of the same FLOPs, all measured in one run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sq::bench {

struct RealModelBenchOptions {
  std::string model;          ///< the FP32 original: GGUF, HF directory, .sqm (FP32), llama2.c .bin
  std::string tokenizer;      ///< tokenizer for `text` when the model carries none ("" = the model's)
  std::string text;           ///< text for the sq-eval throughput rows ("" = no eval rows)
  int prompt_tokens = 512;    ///< pp: one prefill of this many tokens, logits of the last one
  int gen_tokens = 128;       ///< tg: single-token decode steps from an empty cache, logits of each
  int eval_ctx = 512;         ///< eval rows: llamacpp protocol -c eval_ctx
  int64_t eval_chunks = 8;    ///< eval rows: the first N chunks of `text` (0 = all)
  int64_t group = 128;        ///< W4A16 group size
  /// The quantized variants to measure, by name (fp32 is always measured: it is the ratio base
  /// and the sgemm bound's model); empty = all of them.
  std::vector<std::string> variants;
  /// Converted files measured as further variants (named by their file name without ".sqm"), e.g.
  /// sq-convert's outputs whose recipe changes the kernels (--rotate's online transforms).
  std::vector<std::string> files;
  double min_seconds = 1.0;   ///< minimum measuring time per contender (interleaved rounds)
};

/// Loads `model` once and builds, in memory, from its FP32 weights:
///   fp32           the model as loaded (ops::sgemm linears: oneDNN for prefill, OpenBLAS sgemv for decode);
///   w8a8-o1-head   W8A8 with per-tensor weights and per-token dynamic activations (SmoothQuant's O1:
///                  smoothing only rescales weights and norms, so the kernels and their speed are
///                  those of `sq-convert --preset O1 --quantize-head`), LM head INT8 too, as
///                  llama.cpp's Q8_0 files quantize output.weight;
///   w4a16-g128     W4A16 RTN g`group` symmetric, LM head FP32 (what sq-convert --scheme w4a16
///                  writes; GPTQ changes values, not kernels);
///   w4a16-g128-head the same with the LM head W4A16 too (llama.cpp's Q4_0 files quantize it);
///   w4a16-g128-head-a8 the same with INT8 decode activations (W4DecodeActivations::Int8, as
///                  llama.cpp's Q4_0 × Q8_0 dot product); only where w4_int8_decode_supported().
///   and every file of `files` as it loads (a converted .sqm of the same model; InputError from its
///   loader, UsageError when its vocabulary or layer count is not the model's).
/// For each it times, interleaved with the others (time_interleaved, best of rounds):
///   pp  one prefill of `prompt_tokens` tokens into an empty cache (LogitsFor::LastToken), the
///       work of llama-bench -p N;
///   tg  `gen_tokens` single-token steps from an empty cache, every step's logits (llama-bench -n N);
/// and, when `text` is set, sq-eval's throughput (evaluate_perplexity, llamacpp protocol, tokens
/// processed per second, as sq-eval reports it) over the first `eval_chunks` chunks.
/// The sgemm bound: the prefill's FLOPs (2·pp·in·out per linear, causal QKᵀ and PV, the LM head
/// for the last row) at the rate ops::sgemm (oneDNN's dnnl_sgemm at these sizes) reaches on the
/// model's own linear shapes (C[pp, out] = A[pp, in]·Wᵀ, each distinct shape timed with hot
/// operands, weighted by the shape's count); pp of the FP32 model is reported as a fraction of it.
/// Also a strict bound, the same FLOPs at the faster of ops::sgemm and oneDNN's matmul primitive
/// on the plain matrices per shape, and, for reference, the rate of the matmul on packed weights
/// (what DenseLinear runs since it outpaced sgemm; not a bound).
/// And the FP32 model's linears alone, in layer order on random inputs of pp rows (weights read
/// from memory as in the prefill): the part of the pp time that is GEMM.
/// Prints a table (tokens/s and ratios to FP32) and returns everything as JSON. Throws InputError
/// from the loader, UsageError for prompt_tokens or gen_tokens < 1, eval_ctx < 2 or a name in
/// `variants` that is not one of the above (the message lists them).
nlohmann::json run_real_model_bench(const RealModelBenchOptions& options);

}  // namespace sq::bench
