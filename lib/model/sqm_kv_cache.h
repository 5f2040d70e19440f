// The KV-cache quantization stored in a .sqm file: the header's `kv_cache` object and, for the
// nuq formats, each layer's codebooks and per-channel key scaling (docs/formats.md, "KV cache").
#pragma once

#include <string>
#include <vector>

#include "formats/sqm_file.h"
#include "quant/kv_codec.h"
#include "runtime/kv_format.h"

namespace sq {

/// A KV format with its offline parameters.
struct KVQuantization {
  KVSpec spec;                         ///< fp32 when the file has no kv_cache header
  std::vector<NuqLayerParams> params;  ///< [n_layers] for nuq formats, empty otherwise
};

/// Tensor names of layer l's nuq parameters: "model.layers.{l}.kv.key_codebook" (F32 [2^b]),
/// ".value_codebook" (F32 [2^b]), ".key_offset" and ".key_scale" (F32 [kv_width], per-channel keys).
std::string kv_tensor_name(int layer, const char* what);

/// Reads the file's KV quantization. Throws InputError naming the file and tensor when the header
/// is invalid or a nuq tensor is missing, mis-shaped, unsorted (codebooks) or non-finite — e.g.
/// "model.layers.2.kv.key_codebook has 16 entries, expected 8 for nuq3".
KVQuantization kv_quantization_from_sqm(const SqmFile& file, const ModelConfig& config);

/// The KV format a run uses: `file` (from the model) when `kv` is empty; otherwise the format `kv`
/// names (parse_kv_spec) with `group` (> 0 to set), `sink` (≥ 0 to set) and `keys` ("" = default)
/// applied. Uniform formats need nothing from the file; a nuq format needs the file's codebooks,
/// so `kv` may only name the nuq format the file was converted for (its options come from the
/// file). `converted` says whether `file` came from a converted .sqm (else the model is a plain
/// checkpoint, which holds no KV codebooks). Throws UsageError naming the option and, for nuq, the
/// sq-convert command that is needed.
KVQuantization select_kv_format(const KVQuantization& file, bool converted, const std::string& kv, int group, int sink,
                                const std::string& keys, const ModelConfig& config);

}  // namespace sq
