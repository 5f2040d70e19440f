// SHA-256 hashes for provenance records: of files, of byte strings, and of a model's identity.
#pragma once

#include <string>
#include <string_view>

#include "core/checkpoint.h"

namespace sq {


/// Lower-case hex SHA-256 of the bytes of `path`, read in 1 MiB blocks (constant memory; OpenSSL
/// EVP). Throws InputError naming the file when it cannot be opened or read.
std::string sha256_file_hex(const std::string& path);

/// Lower-case hex SHA-256 of `bytes`.
std::string sha256_hex(std::string_view bytes);

/// The canonical JSON text that model_fingerprint() hashes (UTF-8, no whitespace, keys sorted by
/// byte value at every level):
///
///   {"config":{CONFIG},"tensors":{"NAME":{"dtype":"f32","shape":[D0,D1,...]},...}}
///
/// CONFIG holds every ModelConfig field under its C++ name: integers (bos_id, dim, eos_id,
/// head_dim, hidden_dim, max_seq_len, n_heads, n_kv_heads, n_layers, vocab_size) as JSON
/// integers; booleans (qkv_bias, tied_embeddings) as true/false; architecture as a string;
/// rope_layout as the string "interleaved" or "half-split"; the floats norm_eps and rope_theta as
/// strings formatted with printf "%.9g" of the float value (exact float round trip, e.g.
/// "9.99999975e-06", "10000"). When RoPE is scaled (rope_scaling not Default) CONFIG also holds
/// "rope_scaling": {"type": "linear" | "llama3", "factor": "%.9g"} plus, for llama3,
/// "low_freq_factor" and "high_freq_factor" ("%.9g" strings) and
/// "original_max_position_embeddings" (integer); plain-RoPE models have no such key, so their
/// fingerprints are those of earlier versions. "tensors" lists every tensor of the checkpoint under its canonical
/// name with its shape and dtype "f32" (the in-memory dtype of all checkpoint tensors). Weight
/// values are not hashed. Python reproduces it with
/// `json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`.
std::string model_fingerprint_json(const Checkpoint& ckpt);

/// Identity of a model's architecture and tensor inventory: sha256_hex(model_fingerprint_json()).
/// Checkpoints of the same model in different files (llama2.c vs converted safetensors) agree when
/// their config and tensor names/shapes agree (note: rope_layout differs between llama2.c and HF
/// files, so those differ). Does not depend on the weight values.
std::string model_fingerprint(const Checkpoint& ckpt);
/// model_fingerprint of a checkpoint with config `config` and tensors named and shaped as `shapes`
/// (a model read layer by layer, model/layer_stream.h): the same hash as the loaded checkpoint's.
std::string model_fingerprint(const ModelConfig& config, const TensorShapes& shapes);

}  // namespace sq
