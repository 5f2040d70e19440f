// Export of a packed .sqm model to a GGUF v3 file that llama.cpp and transformers load (issue 18;
// docs/formats.md, "GGUF export").
//
// Names, metadata keys and the Q/K row permutation come from the same GgufArchitecture table the
// GGUF reader uses (formats/gguf_architecture.h), applied in the inverse direction; before any
// byte is written, the metadata is parsed back with the reader (gguf_model_config) and the
// ModelConfig it yields must equal the .sqm's, so sqkit reads its own export as the same model.
//
// Type mapping (exact where the .sqm's quantized values are representable):
//   I4x2 symmetric INT4, FP16 Δ per group of g (g, in multiples of 32)  -> Q4_0 (exact)
//   U4x2 asymmetric INT4 + zero z                                        -> Q4_1 (m = −Δ·z rounded to FP16)
//   U4x2 K-quant (weight_superblock_scale, quant/q4k_layout.h), 256 | in  -> Q4_K (exact: heads copied)
//   U4x2 K-quant, rows not a multiple of 256                            -> Q4_1 (exact: Δ and m are FP16)
//   I8 per-channel / per-tensor INT8 (W8A8 weights; --quantize-head)     -> Q8_0 (row scale rounded to FP16)
//   F32 / F16 / BF16 2-D tensors as stored; 1-D tensors (norms, biases)  -> F32
// With GgufExportOptions::dequantize every tensor is F32: the weights exactly as sqkit's runner
// dequantizes them (Δ·(q − z), s·q), the oracle target of gguf.quants.dequantize.
// Dropped with a warning: static activation steps (*.input_scale, W8A8 O3) and a KV-cache format
// (header kv_cache, model.layers.N.kv.*). Refused (UnsupportedError, exit 2 in the tools): Atom
// W4A4, INT4 group sizes or row lengths that are not multiples of 32 (unless dequantized to F32),
// architectures other than
// llama (and Mistral without a binding sliding window), qwen2 and gemma3, llama3 RoPE scaling,
// and any .sqm tensor the mapping does not place.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint.h"

namespace sq {

/// Options of export_gguf.
struct GgufExportOptions {
  /// Replace an existing output file (otherwise UsageError). The input is never overwritten.
  bool force = false;
  /// `--outtype f32`: every tensor written as F32, quantized weights dequantized exactly as
  /// sqkit's runner uses them (general.file_type ALL_F32).
  bool dequantize = false;
};

/// What export_gguf wrote and measured.
struct GgufExportReport {
  std::vector<std::string> warnings;   ///< one line each: what was dropped, no tokenizer, ...
  std::string architecture;            ///< general.architecture written ("llama", "qwen2", "gemma3")
  std::string file_type;               ///< llama.cpp LLAMA_FTYPE name, e.g. "MOSTLY_Q4_0"
  int file_type_id = 0;                ///< general.file_type (0 ALL_F32, 1 F16, 2 Q4_0, 3 Q4_1, 7 Q8_0, 14 Q4_K_S, 32 BF16)
  int64_t tensors = 0;                 ///< tensors written
  uint64_t bytes = 0;                  ///< size of the output file
  std::map<std::string, int64_t> tensor_types;  ///< ggml type name -> tensor count
  /// Largest relative FP16 rounding of a stored scale: |fp16(s) − s| / |s| over Q8_0 block
  /// scales (s the INT8 step) and Q4_1 offsets (s = −Δ·z); 0 when none is rounded (Q4_0, floats).
  double max_scale_rounding_rel = 0;
  /// Largest |x_gguf − x_sqkit| over every weight element: x_gguf as ggml dequantizes the block in
  /// FP32 (Q4_1: d·q + m, Q8_0: d·q), x_sqkit as sqkit's runner (Δ·(u − z), s·q). 0 for Q4_0.
  double max_weight_abs_error = 0;
  /// The same relative to the block's largest |x_sqkit| (0 for an all-zero block).
  double max_weight_rel_error = 0;
  /// Metadata keys written, in file order.
  std::vector<std::string> keys;

  /// {"architecture", "file_type", "file_type_id", "tensors", "bytes", "tensor_types",
  ///  "max_scale_rounding_rel", "max_weight_abs_error", "max_weight_rel_error", "warnings"}.
  nlohmann::json to_json() const;
};

/// Writes the model of the .sqm file `sqm_path` to `out_path` as GGUF v3 (alignment 32; the file
/// comment gives the mapping). Streams one tensor at a time into a temporary beside `out_path`,
/// renamed over it at the end: on any error nothing is left at `out_path`.
/// Throws UsageError "PATH already exists (use --force to overwrite it)" when `out_path` exists and
/// !opt.force, UsageError when `out_path` is the input; InputError for an unreadable / invalid
/// .sqm; UnsupportedError (one line naming the cause) for what GGUF cannot express (file comment);
/// OutputError when writing fails.
GgufExportReport export_gguf(const std::string& sqm_path, const std::string& out_path, const GgufExportOptions& opt);

/// The FP32 model the .sqm stores, as canonical tensors (core/checkpoint.h) and its header's
/// ModelConfig: F32/F16/BF16 widened, INT4 weights Δ·(q − z), INT8 weights s·q (per-channel or
/// per-tensor s), an INT8 embedding s_row·q; no activation quantization. This is what
/// export_gguf(dequantize = true) writes and what a Q4_0 export dequantizes to exactly.
/// Throws as export_gguf does for an Atom W4A4 file or an unreadable .sqm.
Checkpoint sqm_dequantized_checkpoint(const std::string& sqm_path);

}  // namespace sq
