// Hugging Face checkpoint directories (config.json + safetensors weights).
//
// Layout (as written by transformers' `save_pretrained(safe_serialization=True)`):
//   DIR/config.json                         see formats/hf_config.h
//   DIR/model.safetensors                   all weights, or, when sharded:
//   DIR/model.safetensors.index.json        {"metadata": {"total_size": BYTES},
//                                            "weight_map": {"tensor name": "shard file name", ...}}
//   DIR/model-00001-of-00002.safetensors    the shards
// Each architecture file (formats/architectures/, formats/hf_architecture.h) maps its tensor names
// onto sqkit's canonical names (core/checkpoint.h), which are the LLaMA family's HF names.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/checkpoint.h"
#include "core/tensor.h"
#include "formats/hf_tensor_selection.h"
#include "formats/safetensors.h"

namespace sq {

/// A Hugging Face checkpoint directory opened once, whose tensors are loaded part by part on
/// demand: the global tensors and the decoder layers a HfTensorSelection names, e.g. one layer at a
/// time when calibrating a model whose FP32 copy would not fit in memory.
///
/// The constructor reads `dir/config.json` (parse_hf_config: the architecture file and the
/// ModelConfig), then `dir/model.safetensors` if present, else `dir/model.safetensors.index.json`
/// and the shards its "weight_map" names; it maps the files (no tensor data is read) and parses
/// their headers. A checkpoint saved from the base model class (no tensor name starts with the
/// architecture's base_prefix, e.g. the original gpt2 files) gets that prefix prepended to every
/// name. Before anything per layer, the config's dimensions are checked against the tensor headers
/// (check_config_against_tensors, formats/config_tensor_check.h: the layer count against the
/// layers present under the architecture's layer prefix, naming its config key; hidden_size /
/// vocab_size / num_attention_heads / num_key_value_heads / intermediate_size against the tensors
/// that carry canonical names). Then the config is refined from tensor values as the architecture
/// does, reading only the small tensors it needs (a Llama config with attention_bias: the o_proj
/// biases of every layer, which leave spec.o_bias false when all zero).
///
/// load(selection) runs the architecture's map_tensors over the selected tensors: each is read by
/// its HF name with its shape checked (SafetensorsFile::load_f32) and stored under its canonical
/// name, split / transposed / folded where the layouts differ. Memory: only the selected tensors
/// are materialized; F16/BF16 ones are widened to owned FP32 copies, F32 ones stored as they are
/// (not split, transposed or folded) stay zero-copy views of the mapping, which they keep alive
/// after the reader is gone. Other tensors (rotary_emb.inv_freq, a stored lm_head.weight of a tied
/// model, ...) are never read.
///
/// Throws InputError naming the file / tensor when: `dir` is not a directory or has no
/// config.json or no weights file; config.json is invalid (see parse_hf_config; UnsupportedError
/// for unsupported architectures or features); the index is not a JSON object with a "weight_map"
/// of strings, names a shard that is not a plain file name inside `dir` (contains '/' or '\\', is
/// "." or "..") or does not exist, or maps a tensor to a shard that does not hold it; a
/// safetensors file is invalid (see SafetensorsFile); a config dimension disagrees with the
/// tensors (naming the config key, its value and the tensor); a tensor is missing ("DIR: tensor
/// 'NAME' is missing (expected shape [..])") or has the wrong shape ("FILE: tensor 'NAME' has
/// shape [..], expected [..] from DIR/config.json"), NAME being the checkpoint's own name; a
/// tensor's dtype is not F32/F16/BF16 (UnsupportedError). The constructor throws these for what it
/// reads (files, headers, the tensors the config refinement reads), load for the tensors it reads.
class HfCheckpointReader {
 public:
  /// Opens `dir` (see the class comment for what is read and thrown).
  explicit HfCheckpointReader(const std::string& dir);
  ~HfCheckpointReader();
  HfCheckpointReader(HfCheckpointReader&&) noexcept;
  HfCheckpointReader& operator=(HfCheckpointReader&&) noexcept;

  /// The directory given to the constructor.
  const std::string& dir() const;
  /// The model config: config.json's, refined from tensor values (see the class comment), with
  /// rope_layout HalfSplit. Every load returns this same config, whatever its selection.
  const ModelConfig& config() const;

  /// The selected tensors as FP32 under their canonical names (core/checkpoint.h): the global
  /// tensors when selection.globals, and every `model.layers.{l}.*` tensor of the selected layers;
  /// nothing else. The result has config(), format "hf-safetensors" and source dir(). May be called
  /// any number of times; each call reads its tensors afresh. Throws UsageError "DIR: layer L is
  /// out of range: the checkpoint has N layers (KEY = N)" (or "layers [A, B) are ...", "layers
  /// from A on are ..."; KEY the architecture's layer-count key) when the selection names a layer outside [0, N):
  /// first_layer negative or past N, end_layer below first_layer, or above N and not
  /// HfTensorSelection::kToLastLayer. Throws the InputErrors of the class comment for a selected
  /// tensor.
  Checkpoint load(const HfTensorSelection& selection) const;

 private:
  struct State;
  std::unique_ptr<const State> state_;
};

/// Loads the whole HF checkpoint directory `dir` as FP32 tensors under their canonical names:
/// HfCheckpointReader(dir).load(HfTensorSelection::all()), with its errors. The result has format
/// "hf-safetensors", source `dir`, config.rope_layout HalfSplit.
Checkpoint load_hf_checkpoint(const std::string& dir);

/// Parses the text of a `model.safetensors.index.json` into tensor name -> shard file name.
/// `source` names the file in messages. Throws InputError naming `source` when `text` is not JSON,
/// not an object, has no object "weight_map", a value that is not a string, or a shard that is not
/// a plain file name (contains '/' or '\\' or NUL, is empty, "." or ".."). Other keys ("metadata")
/// are ignored.
std::map<std::string, std::string> parse_safetensors_index(std::string_view text, const std::string& source);

/// Writes `ckpt` as a genuine HF checkpoint directory `dir` (created if needed; existing files of
/// the same names are replaced, each atomically): config.json (make_hf_config_json, torch_dtype
/// float32 / float16 / bfloat16), and `model.safetensors` when `shards` == 1, otherwise `shards`
/// files `model-0000i-of-0000n.safetensors` (contiguous runs of the canonical tensor order, balanced
/// by bytes, none empty) plus `model.safetensors.index.json`. A stale file of the other layout
/// (single file vs index) is removed so the directory loads unambiguously. Safetensors metadata is
/// {"format": "pt"} as transformers expects. Only the canonical tensors the config implies are
/// written (other entries of ckpt.tensors are ignored; lm_head.weight only when untied). `dtype` is the storage dtype: "F32", "F16" or "BF16"
/// (round-to-nearest-even).
///
/// Every architecture sqkit reads has a writer (HfArchitecture::make_config / hf_plan); an unknown
/// architecture name is refused by name (UnsupportedError).
///
/// RoPE: when ckpt.config.rope_layout is Interleaved (llama2.c source), q_proj / k_proj weights
/// (and biases) are row-permuted with permute_qk_rows_for_half_split (n_heads for q, n_kv_heads
/// for k), so the directory is a HalfSplit checkpoint as HF's `convert_llama_weights_to_hf.py`
/// produces. A Llama config with qkv_bias gets attention_bias = true and zero o_proj biases.
///
/// Throws UsageError for a bad `dtype` or `shards` (< 1 or more than the number of tensors),
/// InputError when a tensor of `ckpt` is missing or misshapen, UnsupportedError for a config HF
/// cannot express (make_hf_config_json), OutputError when writing fails.
void save_hf_checkpoint(const Checkpoint& ckpt, const std::string& dir, const std::string& dtype, int shards = 1);

/// A canonical tensor (core/checkpoint.h name and shape) whose FP32 values are produced piece by
/// piece when written (TensorGenerator, formats/safetensors.h).
struct GeneratedTensor {
  std::string name;
  std::vector<int64_t> shape;
  TensorGenerator generate;
};

/// Writes an HF checkpoint directory like save_hf_checkpoint (same files, sharding, metadata and
/// config.json), from generated tensors instead of a loaded Checkpoint: memory is one
/// 2^20-element piece whatever the model's size, so a checkpoint larger than RAM (a LLaMA-7B
/// shape, 13.5 GB in BF16) can be written. The architecture's write plan must store every HF
/// tensor as one canonical tensor unchanged (the LLaMA family: no fused rows, no norm offsets) and
/// config.rope_layout must be HalfSplit; a bias is written when `tensors` holds one. Shapes are
/// written as given (the loader checks them against config.json).
/// Throws UsageError for a bad `dtype` or `shards`; InputError "generated checkpoint: tensor 'NAME'
/// is missing" when the plan needs a tensor `tensors` lacks; UnsupportedError for another plan or
/// layout; what ModelConfig::validate and make_hf_config_json throw; OutputError when writing fails.
void save_hf_checkpoint_generated(const ModelConfig& config, const std::vector<GeneratedTensor>& tensors,
                                  const std::string& dir, const std::string& dtype, int shards = 1);

/// Reorders the rows of a q_proj / k_proj weight ([n_heads*head_dim, in]) or bias
/// ([n_heads*head_dim]) from the interleaved RoPE layout (llama2.c / Meta: pairs (2i, 2i+1)) to the
/// half-split layout (HF `rotate_half`: pairs (i, i + head_dim/2)), per head:
///   new row h*head_dim + j*(head_dim/2) + i  =  old row h*head_dim + 2*i + j,   j in {0,1}.
/// This is HF `convert_llama_weights_to_hf.py`'s
///   permute(w) = w.view(n_heads, head_dim/2, 2, in).transpose(1, 2).reshape(n_heads*head_dim, in).
/// `n_heads` is the head count of this projection: n_heads for q, n_kv_heads for k. Returns an
/// owned tensor. Throws InputError when the shape does not match n_heads*head_dim rows, rank is
/// not 1 or 2, or head_dim is not even and positive.
Tensor permute_qk_rows_for_half_split(const Tensor& w, int n_heads, int head_dim);

/// The inverse of permute_qk_rows_for_half_split (half-split -> interleaved):
///   new row h*head_dim + 2*i + j  =  old row h*head_dim + j*(head_dim/2) + i.
/// Same arguments and errors.
Tensor permute_qk_rows_for_interleaved(const Tensor& w, int n_heads, int head_dim);

}  // namespace sq
