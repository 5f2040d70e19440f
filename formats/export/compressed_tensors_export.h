// sq-export --format compressed-tensors (docs/formats.md, "Exports (sq-export)"): a Hugging Face
// directory that compressed-tensors (and transformers / vLLM through it) loads as a quantized model.
//
// Spec followed (compressed-tensors 0.20): compressors/naive_quantized (format "int-quantized":
// int8 `weight` + `weight_scale`), compressors/pack_quantized (format "pack-quantized":
// pack_to_int32 — the value q + 2^(b−1) of element i of each run of 32/b at bits b·i of one int32 —,
// `weight_shape`, zero points packed along dim 0), quantization/quant_config.py (quantization_config),
// quantization/quant_metadata.py (KV-cache `k_scale` / `v_scale` on the attention module).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/export/sqm_export.h"

namespace sq {

/// Refusals before anything is written (UnsupportedError naming what): scheme w4a4-atom or any
/// scheme but w8a8 / w4a16 / f32 / f16 / bf16; an architecture without a write plan or config; a
/// quantized linear stored as a Conv1D (GPT-2: not an nn.Linear, transformers would not quantize
/// it); W4A16 whose group size does not divide a linear's width (a ragged last group: compressed-
/// tensors' group strategy has ⌈in/g⌉·g columns), naming the tensor; --kv fp8 with a calibration
/// file that cannot give the scales (calibration_kv_scales).
void check_compressed_tensors_export(const ExportInput& in, const ExportOptions& options, ExportSummary& summary);

/// Writes config.json (the architecture's config + quantization_config), model.safetensors and the
/// tokenizer into `dir`.
void write_compressed_tensors_export(const ExportInput& in, const ExportOptions& options, const std::string& dir,
                                     ExportSummary& summary);

/// compressed-tensors' pack_to_int32 along dim 1 for `bits` ∈ {4, 8}: `codes` [rows, cols] in
/// [−2^(bits−1), 2^(bits−1) − 1] → int32 [rows, ⌈cols·bits/32⌉] (little-endian), code c of row r
/// stored as q + 2^(bits−1) at bits bits·(c mod (32/bits)) of word (r, c / (32/bits)); the unused
/// high bits of a last partial word are 0.
std::vector<int32_t> pack_int_rows(const std::vector<int8_t>& codes, int64_t rows, int64_t cols, int bits);

/// pack_to_int32(..., packed_dim=0) for 4-bit zero points: `zp` [rows, cols] in [−8, 7] → int32
/// [⌈rows/8⌉, cols], zp (r, j) stored as (zp + 8) at bits 4·(r mod 8) of word (r/8, j).
std::vector<int32_t> pack_int4_cols(const std::vector<int8_t>& zp, int64_t rows, int64_t cols);

/// Per-layer FP8 (E4M3, max 448) KV-cache scales from an sq-calibrate file: k_scale[l] =
/// absmax(post-RoPE keys)/448, v_scale[l] = absmax(values)/448. The file records keys before
/// RoPE (per-channel absmax a_c); RoPE rotates each channel pair (i, j) of a head, so a post-RoPE
/// key channel is bounded by √(a_i² + a_j²): the key bound is the maximum of that over the rotated
/// pairs (pairs (i, i + r/2) for half-split, (2i, 2i+1) interleaved, r = rotated channels) and of
/// a_c over unrotated channels (no RoPE: keys as recorded). The bound is tight when a token
/// reaches both maxima at a rotation angle of 45°; it never clips a calibration key. Throws
/// InputError naming the file when its layer count or K/V width differs from the model's, or its
/// model fingerprint differs from the .sqm's source fingerprint; UnsupportedError when the .sqm
/// smoothed v → o (--smooth-vo: the recorded values are not the exported v_proj's).
void calibration_kv_scales(const ExportInput& in, const std::string& calibration, std::vector<float>& k_scale,
                           std::vector<float>& v_scale);

}  // namespace sq
