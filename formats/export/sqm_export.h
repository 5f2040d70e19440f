// sq-export: a .sqm model as a Hugging Face checkpoint directory (docs/formats.md, "Exports
// (sq-export)").
//
// Formats are a table (export_formats()): name -> a check run before anything is written and a
// writer that fills a fresh directory. export_sqm() opens the .sqm, checks the output location,
// runs the format's check, writes into a temporary directory beside the output and renames it over
// the output only when everything succeeded (with --force the old directory is replaced only then),
// so a refused or failed export leaves nothing behind.
//   * "compressed-tensors": config.json with quantization_config, model.safetensors holding W8A8
//     (int-quantized) or W4A16 (pack-quantized) linears as compressed-tensors stores them, optional
//     FP8 KV-cache scales (formats/export/compressed_tensors_export.h);
//   * "hf": a plain FP32 checkpoint whose weights are the .sqm's dequantized exactly as sqkit's
//     runner uses them (Δ·q for INT8, Δ·(q − z) for INT4).
// Both write the architecture's tensors by its write plan (HfArchitecture::hf_plan) and the
// embedded tokenizer (tokenizer.json / tokenizer.model verbatim, tokenizer.gguf for GGUF models).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/model_config.h"
#include "core/tensor.h"
#include "formats/hf_architecture.h"
#include "formats/sqm_file.h"

namespace sq {

/// What sq-export was asked for.
struct ExportOptions {
  std::string format;       ///< a name of export_formats(), e.g. "compressed-tensors"
  bool force = false;       ///< replace an existing output directory (only after success)
  std::string kv;           ///< "" or "fp8": per-tensor FP8 KV-cache scales (compressed-tensors only)
  std::string calibration;  ///< sq-calibrate file with the K/V statistics for --kv fp8
};

/// What an export wrote (the tool prints it, and --json reports it).
struct ExportSummary {
  std::string format, scheme;           ///< export format; the .sqm's quantization.scheme
  std::string output;                   ///< the output directory
  std::vector<std::string> files;       ///< file names written inside it, sorted
  int64_t tensors = 0;                  ///< tensors in model.safetensors
  uint64_t safetensors_bytes = 0;       ///< size of model.safetensors
  std::vector<std::string> notes;       ///< warnings / notes for stderr ("dropped kv_cache int4 ...")
  nlohmann::ordered_json quantization_config;  ///< as written in config.json (null when none)
};

/// The opened .sqm an exporter reads.
struct ExportInput {
  std::shared_ptr<SqmFile> file;
  ModelConfig config;             ///< header.model_config
  nlohmann::json quant;           ///< header.quantization ({} when absent)
  std::string scheme;             ///< quant.scheme ("f32" when absent)
};

/// One export format: `check` refuses (UnsupportedError / UsageError, naming what) before anything
/// is written; `write` fills the empty directory `dir` (config.json, model.safetensors, tokenizer)
/// and records what it did in `summary`.
struct ExportFormat {
  const char* name;
  const char* description;
  void (*check)(const ExportInput& in, const ExportOptions& options, ExportSummary& summary);
  void (*write)(const ExportInput& in, const ExportOptions& options, const std::string& dir, ExportSummary& summary);
};

/// Every export format, in the order --help lists them ("compressed-tensors", "hf"; the GGUF
/// exporter is one more entry).
const std::vector<ExportFormat>& export_formats();

/// Exports the .sqm `sqm_path` to directory `out_dir` as `options.format`. Order: unknown format
/// (UsageError) → output location (UsageError: `out_dir` exists without force, is a file, is or
/// contains an input, or its parent is missing / not writable) → the input (InputError "PATH: not
/// an sqkit .sqm file", and what SqmFile::open throws) → the format's check (UnsupportedError
/// naming the scheme, architecture or tensor that cannot be expressed) → writing into
/// "<out_dir>.tmp-<pid>-XXXXXX" → rename (OutputError on I/O failures). Nothing is left under
/// `out_dir` (nor a temporary) when any step throws.
ExportSummary export_sqm(const std::string& sqm_path, const std::string& out_dir, const ExportOptions& options);

// ---- shared by the exporters -----------------------------------------------------------------------

/// One canonical linear of a .sqm (docs/formats.md "Tensors written by sq-convert") with its codes
/// unpacked: a float weight, INT8 (W8A8) or INT4 (W4A16) codes.
struct SqmLinear {
  enum class Kind { Float, Int8, Int4 };
  Kind kind = Kind::Float;
  int64_t out = 0, in = 0;
  Tensor weight;                 ///< Float: FP32 [out, in]
  std::vector<int8_t> codes;     ///< Int8: q [out·in]; Int4: q ∈ [−8, 7] (symmetric) or u ∈ [0, 15] (asymmetric) [out·in]
  std::vector<float> scale;      ///< Int8: Δ [out] or [1]; Int4: Δ [out·groups] (FP16 widened exactly)
  int64_t group = 0, groups = 0; ///< Int4: group size g and G = ⌈in/g⌉
  bool asym = false;             ///< Int4: codes are u with zero points
  std::vector<uint8_t> zero;     ///< Int4 asymmetric: z ∈ [0, 15] [out·groups]
  bool has_input_scale = false;  ///< Int8 with static activations: input_scale present
  float input_scale = 0.0f;      ///< its Δ
  Tensor bias;                   ///< F32 [out], empty when none
};

/// Reads linear `base` (e.g. "model.layers.0.self_attn.q_proj") of `in`: `base.weight` F32/F16/BF16
/// (Float), I8 (with `base.weight_scale` F32 [out] or [1], `base.input_scale` F32 [1] when
/// present) or I4x2 / U4x2 (with `base.weight_scale` F16 [out, G], `base.weight_zero` U4x2 [out, G],
/// G from header quantization.group_size), and `base.bias`. Throws InputError naming the file and
/// tensor for anything missing or misshapen, UnsupportedError for Atom W4A4 weights.
SqmLinear read_sqm_linear(const ExportInput& in, const std::string& base);

/// The FP32 weight [out, in] exactly as sqkit's runner uses it: the float weight, Δ_r·q (INT8,
/// per-channel Δ_r or the one per-tensor Δ), or Δ_{r,j}·(q − z_{r,j}) (INT4; z = 0 symmetric),
/// computed in FP32 (exact: FP16 Δ times a small integer).
Tensor dequantize_sqm_linear(const SqmLinear& l);

/// Canonical float tensor `name` of the .sqm as FP32 (F32/F16/BF16 widened; an I8 `X.weight`
/// such as the --quantize-head embedding dequantized with read_sqm_linear(X)), or an empty Tensor
/// when absent.
Tensor sqm_canonical_float(const ExportInput& in, const std::string& name);

/// The linears of plan entry `e` stacked by its row map (plan_row_map): codes, per-row scales,
/// zero points and biases follow their rows. Throws UnsupportedError naming the HF module when
/// its parts mix kinds (float and quantized, INT8 and INT4), group sizes, or per-tensor scales /
/// static input scales that differ (one per-tensor scale cannot hold two).
SqmLinear stack_plan_linear(const ExportInput& in, const HfPlanEntry& e);

/// Writes `bytes` to `path` atomically; `what` is not used in messages beyond the path.
void write_text_file(const std::string& path, const std::string& bytes);

/// Writes the embedded tokenizer (header.tokenizer) into `dir`: tokenizer.json (hf-json) or
/// tokenizer.model (sentencepiece) verbatim; a GGUF-sourced model's metadata-only tokenizer.gguf
/// verbatim with a note (transformers reads it with AutoTokenizer.from_pretrained(dir,
/// gguf_file="tokenizer.gguf")); a llama2.c tokenizer has no Hugging Face form: a note, nothing
/// written. Records files and notes in `summary`.
void write_export_tokenizer(const ExportInput& in, const std::string& dir, ExportSummary& summary);

/// The header's kv_cache when it is a quantized format no serving engine has (int2-int8 uniform,
/// nuq): a note naming it ("kv_cache nuq3 ... dropped"); empty otherwise.
std::string dropped_kv_cache_note(const ExportInput& in);

}  // namespace sq
