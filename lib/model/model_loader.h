// Opens any supported model path (llama2.c .bin, Hugging Face directory, GGUF file, .sqm) as a
// runnable Decoder.
#pragma once

#include <memory>
#include <string>

#include "core/checkpoint.h"
#include "model/decoder.h"
#include "model/sqm_kv_cache.h"

namespace sq {

class SqmFile;

struct LoadedModel {
  std::unique_ptr<Decoder> model;
  std::string path;
  std::string format;              ///< "llama2c", "hf-safetensors", "gguf", "sqm"
  /// Tokenizer file found beside the model ("" when none); for a GGUF model the .gguf itself
  /// (its tokenizer.ggml.* metadata).
  std::string default_tokenizer;
  /// The FP32 checkpoint the model was built from (llama2c / HF: views of the mapped files, or
  /// owned widened copies; GGUF: owned dequantized tensors). Empty for .sqm files.
  Checkpoint checkpoint;
  std::shared_ptr<SqmFile> sqm;    ///< the packed file, for format "sqm"
  /// The KV-cache format the file was converted for (`sq-convert --kv`), fp32 otherwise.
  KVQuantization kv;
};

/// Detects the format of `path` and loads it: a directory is a Hugging Face checkpoint
/// (config.json + safetensors); a file starting with "SQKITMDL" is a packed .sqm model (checksums
/// verified); a file starting with "GGUF" is a GGUF model (load_gguf_checkpoint,
/// formats/gguf_checkpoint.h: dequantized to owned FP32 tensor by tensor; architectures `llama`,
/// `gemma3`, `qwen2`; others are refused with UnsupportedError naming them); a file with a llama2.c header is a
/// llama2.c checkpoint.
/// Dense linears keep packed GEMM copies only when they hold at most kPrepackMaxModelBytes
/// (model/linear.h); a larger model runs the same kernels on its plain weights.
/// Every stored floating-point value is checked once here (check_checkpoint_finite: the FP32
/// tensors, F16/BF16 ones after widening; check_sqm_finite: a .sqm's F32/F16/BF16 tensors, scales
/// included), so nothing downstream runs on NaN/Inf weights.
/// Throws InputError ("cannot open PATH: ...", "PATH: not a recognized model ...") or the
/// format reader's InputError/UnsupportedError; NonFiniteError "PATH: tensor 'NAME' holds a
/// non-finite value (nan) at index I ..." for a NaN or ±Inf weight.
LoadedModel load_model(const std::string& path);

/// The tokenizer file of Hugging Face checkpoint directory `dir`: DIR/tokenizer.model
/// (SentencePiece) when present, else DIR/tokenizer.json (byte-level BPE), else "".
std::string default_hf_tokenizer(const std::string& dir);

}  // namespace sq

namespace sq {
class Tokenizer;

/// Opens the tokenizer for `loaded`: `tokenizer_path` when non-empty, else the one embedded in a
/// .sqm file, else the one found beside the model. Throws UsageError when there is none ("give --tokenizer"),
/// InputError "PATH has no embedded tokenizer (converted without one); give --tokenizer FILE" for a
/// .sqm written without a tokenizer and no `tokenizer_path`, and InputError when its vocabulary
/// size differs from the model's (naming both sizes and files).
std::unique_ptr<Tokenizer> open_tokenizer_for(const LoadedModel& loaded, const std::string& tokenizer_path);

/// Like open_tokenizer_for, but returns nullptr instead of throwing when the model has no tokenizer
/// at all (no `tokenizer_path`, none embedded in a .sqm, none found beside the model): for
/// pre-tokenized input (`--token-ids`), where a tokenizer is optional. A tokenizer that exists but
/// cannot be read, or whose vocabulary differs from the model's, still throws as above.
std::unique_ptr<Tokenizer> open_tokenizer_if_any(const LoadedModel& loaded, const std::string& tokenizer_path);
}  // namespace sq
