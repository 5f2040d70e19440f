// Reader for llama2.c checkpoints (Karpathy's llama2.c `run.c` / `export.py` layouts).
#pragma once

#include <memory>
#include <string>

#include "core/checkpoint.h"
#include "formats/mapped_file.h"

namespace sq {

/// Loads a llama2.c checkpoint as FP32 tensors under sqkit's canonical (HF-style) names.
///
/// Two layouts are accepted:
///  * legacy "version 0" (`export.py --version 0`, the shared stories260K.bin): 7 int32
///    {dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len} (a negative vocab_size
///    means an unshared classifier), then float32 tensors in the order token embedding [vocab, dim],
///    attention RMSNorm [L, dim], wq [L, dim, dim], wk [L, kv, dim], wv [L, kv, dim], wo [L, dim, dim],
///    FFN RMSNorm [L, dim], w1 [L, hidden, dim], w2 [L, dim, hidden], w3 [L, hidden, dim],
///    final RMSNorm [dim], freq_cis_real/imag [seq_len, head_dim/2] (ignored), classifier [vocab, dim]
///    if unshared. (kv = n_kv_heads * head_dim.)
///  * "version 1" (`export.py --version 1`): uint32 magic 0x616b3432 ("ak42"), int32 version 1,
///    the same 7 int32, uint8 shared_classifier, zero padding to 256 bytes; then float32 attention
///    norms, FFN norms, final norm, token embedding, wq, wk, wv, wo, w1, w2, w3 (each for all layers),
///    and the classifier if unshared.
/// Tensors are zero-copy views into the memory-mapped file. The config gets llama2.c's fixed
/// hyper-parameters: RMSNorm eps 1e-5, RoPE theta 10000, RopeLayout::Interleaved, BOS 1, EOS 2.
///
/// Throws InputError naming `path` when the file is missing, too short for its header, has
/// non-positive sizes, or its size differs from what the header implies (truncated / trailing
/// bytes); UnsupportedError for other versions (e.g. version 2, the int8 export).
Checkpoint load_llama2c_checkpoint(const std::string& path);

/// Same as the path version on an already mapped file (or a MappedFile::from_bytes buffer);
/// messages and Checkpoint::source use file->path().
Checkpoint load_llama2c_checkpoint(std::shared_ptr<const MappedFile> file);

/// True when the first bytes of `path` look like a llama2.c checkpoint (either layout) — used to
/// route a file given with `-m`. Never throws for unreadable files (returns false).
bool looks_like_llama2c_checkpoint(const std::string& path);

}  // namespace sq
