// GGUF model files (llama.cpp) as sqkit Checkpoints: the config from the metadata, the tensors
// dequantized to owned FP32 one at a time.
//
// The per-architecture mapping (metadata keys -> ModelConfig fields, GGUF tensor names ->
// canonical names, shapes) is the data in formats/gguf_architecture.h; this file interprets it.
// Supported: `llama` (SmolLM2, Llama 1/2/3 without rope_freqs, Mistral-style llama files) and
// `gemma3` (Gemma 3 text models such as Gemma 3 270M: sliding-window local layers and global layers,
// QK-norm, pre+post norms, GeGLU, sqrt(dim) embedding scale; q/k rows are stored in the half-split
// order already, and the norms hold 1 + w already, see formats/gguf_architecture.cpp).
//
// Q/K row order. llama.cpp's convert_hf_to_gguf.py (Decoder.permute) reorders the rows of every
// HF q_proj / k_proj from transformers' half-split RoPE layout (pairs (i, i + d/2), `rotate_half`)
// to the interleaved layout of its RoPE "normal" mode (pairs (2i, 2i+1)), per head (n_heads heads
// for q, n_kv_heads for k): GGUF row h*d + 2i + j = HF row h*d + j*d/2 + i. Running the GGUF rows
// with rope_layout = Interleaved is the same function mathematically (RoPE rotates the same value
// pairs by the same angles, element by element with the same FP32 operations), but the q·k dot
// products then add the head's channels in another order, so scores differ from transformers' at
// FP32 rounding level. transformers' own GGUF loader undoes the permutation (reverse_permute in
// its GGUF integration) and runs rotate_half. So the loader restores the HF row order (a pure row
// permutation while dequantizing: no rounding, no extra copy) and sets rope_layout = HalfSplit:
// the Checkpoint is then exactly the checkpoint transformers builds from this file — the same
// tensors in the same order — and everything downstream (SmoothQuant smoothing of input columns,
// GPTQ/W4A16 groups along input columns, Atom channel reordering, KVQuant per-channel key
// statistics, .sqm conversion which records rope_layout "half-split", save_hf_checkpoint which
// writes half-split rows unchanged) sees the same model as from the HF checkpoint directory.
#pragma once

#include <string>

#include "core/checkpoint.h"
#include "core/model_config.h"
#include "formats/gguf_file.h"
#include "formats/hf_tensor_selection.h"

namespace sq {

/// True when `path` starts with the GGUF magic "GGUF" (bytes 47 47 55 46) or is named *.gguf (a
/// .gguf file with a wrong magic then gets the GGUF reader's message rather than "not a model").
bool looks_like_gguf(const std::string& path);

/// The ModelConfig of GGUF file `file` from its metadata (keys of formats/gguf_architecture.h,
/// ARCH = general.architecture):
///   ARCH.block_count, .embedding_length, .feed_forward_length, .attention.head_count,
///   .context_length (required integers, 1..2^24), .attention.head_count_kv (default: head_count),
///   .attention.layer_norm_rms_epsilon (required), .rope.freq_base (default 10000);
///   head_dim = ARCH.attention.key_length when present, else embedding_length / head_count;
///   ARCH.attention.value_length and ARCH.rope.dimension_count, when present, must equal head_dim;
///   vocab_size = ARCH.vocab_size, else the length of tokenizer.ggml.tokens;
///   RoPE scaling as llama.cpp reads it: ARCH.rope.scaling.type (absent = "linear") "none" or
///   "linear" with ARCH.rope.scaling.factor (else the legacy ARCH.rope.scale_linear; absent or 0
///   = 1, no scaling); ARCH.rope.scaling.original_context_length only matters to yarn;
///   bos_id / eos_id = tokenizer.ggml.bos_token_id / eos_token_id when present;
///   rope_layout HalfSplit (see the Q/K note above); tied_embeddings = no `output.weight` tensor;
///   spec = the architecture's DecoderSpec with embed_scale, attn_scale, and the per-layer sliding
///   windows (ARCH.attention.sliding_window for gemma3; absent or 0 = every layer global) and the
///   local RoPE base that llama.cpp derives from them (GgufArchitecture).
/// Throws UnsupportedError "FILE: GGUF architecture 'qwen3' is not supported yet (supported:
/// llama, gemma3)" for an architecture without a mapping, UnsupportedError naming the key for a RoPE
/// scaling type other than none/linear (yarn, longrope, ...), partial rotary / a value_length
/// other than head_dim, or a feature key the decoder lacks with a non-zero value (gemma3
/// final_logit_softcapping, attn_logit_softcapping); InputError naming the file and the key when a required key is missing, of
/// the wrong type or out of range, and ModelConfig::validate's InputError.
ModelConfig gguf_model_config(const GgufFile& file);

/// gguf_model_config(file), checked against the file's tensor headers as load_gguf_checkpoint does
/// before anything is dequantized (a block_count or width the tensors contradict is an InputError
/// naming the key and the tensor). Reads no tensor data.
ModelConfig gguf_checked_model_config(const GgufFile& file);

/// Loads GGUF file `file` as an FP32 Checkpoint (format "gguf", source file.path()).
///
/// Before anything is dequantized: every tensor of the file is mapped to a canonical name
/// (UnsupportedError naming a tensor the architecture has no mapping for — sqkit does not drop
/// weights it does not understand, e.g. `rope_freqs.weight` or attention biases — and InputError
/// for "blk.N." with N >= block_count); the config is checked against the embedding and layer-0
/// shapes (check_config_against_tensors, naming the GGUF key); every tensor the config implies
/// must be present (InputError naming the GGUF and canonical names) with the expected row-major
/// shape (GGUF dims reversed; InputError naming both shapes) and a type formats/gguf_dequantize.h
/// handles (UnsupportedError naming the tensor and the type).
/// Then each tensor is dequantized straight into its own owned FP32 Tensor (llama's q/k rows
/// restored to the half-split order on the way, see above), one at a time: peak memory is the FP32 model plus
/// the FP32 tensors only, with no second copy of any tensor: each tensor's mapped pages are
/// released once it is dequantized (MappedFile::release). The returned Checkpoint owns all its
/// storage and does not keep `file` alive. Non-finite values are not checked here
/// (load_model calls check_checkpoint_finite).
Checkpoint load_gguf_checkpoint(const GgufFile& file);

/// load_gguf_checkpoint for the tensors `selection` names only (the global tensors and/or a range
/// of layers: model/layer_stream.h reads a GGUF one layer at a time), after the same checks of the
/// whole file. Throws as above, and std::out_of_range when the selection names a layer outside
/// [0, block_count) (other than HfTensorSelection::kToLastLayer).
Checkpoint load_gguf_checkpoint(const GgufFile& file, const HfTensorSelection& selection);

/// Opens `path` (GgufFile: InputError for a malformed file) and loads it as above.
Checkpoint load_gguf_checkpoint(const std::string& path);

}  // namespace sq
