// Hugging Face architectures: how one transformers model class maps onto sqkit.
//
// Each architecture is one small file under formats/architectures/ (llama.cpp, opt.cpp, ...) that
// defines an HfArchitecture: (a) `configure` maps its config.json keys onto ModelConfig (sizes,
// DecoderSpec, RoPE, tokens), with transformers' defaults for missing keys, and refuses by name
// what sqkit's decoder cannot run; (b) `map_tensors` maps its tensor names onto sqkit's canonical
// names (core/checkpoint.h), splitting fused q/k/v and gate/up weights, transposing Conv1D
// weights, folding Gemma's (1 + w) norms, for the global tensors and layers an HfTensorSelection
// names. formats/architectures/registry.cpp lists them; parse_hf_config (formats/hf_config.h) and
// HfCheckpointReader / load_hf_checkpoint (formats/hf_checkpoint.h) dispatch through the list and
// know no architecture by name.
//
// Adding an architecture: write formats/architectures/NAME.cpp defining `HfArchitecture
// hf_architecture_NAME()` (declare it in formats/architectures/architectures.h, add it to the list
// in registry.cpp), and a reference test (tests/hf_tiny_architectures_test.cpp).
#pragma once

#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/checkpoint.h"
#include "core/model_config.h"
#include "core/tensor.h"
#include "formats/hf_tensor_selection.h"

namespace sq {

/// Typed read access to the keys of one config.json object (or a nested object such as MPT's
/// attn_config). A missing key or a JSON null gives the fallback; every error is one line naming
/// `source` (the file path) and the key (with `prefix`, e.g. "attn_config.", in front).
class HfConfigReader {
 public:
  /// `j` and `source` must outlive the reader.
  HfConfigReader(const nlohmann::json& j, const std::string& source, std::string prefix = "");

  const nlohmann::json& json() const { return j_; }
  const std::string& source() const { return source_; }
  /// "PREFIX" + key, as messages name it.
  std::string name(const char* key) const { return prefix_ + key; }

  /// True when `key` is present and not null.
  bool present(const char* key) const;
  /// The first of `keys` that is present, else the first of `keys` (for attribute aliases such as
  /// GPT-2's n_embd / hidden_size).
  const char* pick(std::initializer_list<const char*> keys) const;

  /// Integer value of `key` in int range; `fallback` when absent. Throws InputError when the value
  /// is not an integer or out of range, or when absent and `fallback` is null ("required key").
  int integer(const char* key, const int* fallback) const;
  int integer(const char* key, int fallback) const { return integer(key, &fallback); }
  /// A token id: an integer or a list of integers (its first element); `fallback` when absent,
  /// null or an empty list. Throws InputError for another JSON type.
  int token_id(const char* key, int fallback) const;
  /// A finite number within float range (InputError otherwise); `fallback` when absent.
  float number_f32(const char* key, float fallback) const;
  /// true / false (InputError for another JSON type); `fallback` when absent.
  bool boolean(const char* key, bool fallback) const;
  /// A string (InputError for another JSON type); `fallback` when absent.
  std::string string(const char* key, const std::string& fallback) const;
  /// The nested object `key` as a reader with prefix "key."; an empty object when absent (its
  /// fallbacks then apply). Throws InputError when it is present and not an object.
  HfConfigReader object(const char* key) const;

  /// Throws UnsupportedError "SOURCE: KEY = VALUE is not supported (expected WHAT)", VALUE the
  /// key's JSON text (or "absent").
  [[noreturn]] void refuse(const char* key, const std::string& expected) const;

 private:
  int as_int(const nlohmann::json& v, const char* key) const;

  const nlohmann::json& j_;
  const std::string& source_;
  std::string prefix_;
  std::shared_ptr<nlohmann::json> owned_;  ///< the empty object of an absent nested key
};

/// The tensors of a Hugging Face checkpoint, by their names in the file(s).
class HfTensorSource {
 public:
  virtual ~HfTensorSource() = default;
  /// Header shape of tensor `name`, or nullptr when the checkpoint has no such tensor.
  virtual const std::vector<int64_t>* shape(const std::string& name) const = 0;
  /// File that holds `name` (for messages); only called when shape(name) is not null.
  virtual std::string file(const std::string& name) const = 0;
  /// The checkpoint (directory) for messages about missing tensors.
  virtual const std::string& source() const = 0;
  /// Where the tensors' shapes come from, for messages ("DIR/config.json").
  virtual const std::string& config_source() const = 0;

  bool has(const std::string& name) const { return shape(name) != nullptr; }
  /// Tensor `name` as FP32 (a view into the mapping for F32, a widened copy for F16/BF16) after
  /// checking its shape. Throws InputError "SOURCE: tensor 'NAME' is missing (expected shape [..])"
  /// or "FILE: tensor 'NAME' has shape [..], expected [..] from CONFIG", and what the file reader
  /// throws for a dtype it cannot widen (UnsupportedError).
  Tensor get(const std::string& name, const std::vector<int64_t>& expected_shape) const;

 protected:
  /// Loads `name` (its shape already checked).
  virtual Tensor load(const std::string& name) const = 0;
};

/// An HfTensorSource over tensors held in memory (tests, converters).
class HfTensorMap : public HfTensorSource {
 public:
  HfTensorMap(std::map<std::string, Tensor> tensors, std::string source);
  const std::vector<int64_t>* shape(const std::string& name) const override;
  std::string file(const std::string&) const override { return source_; }
  const std::string& source() const override { return source_; }
  const std::string& config_source() const override { return config_source_; }

 protected:
  Tensor load(const std::string& name) const override { return tensors_.at(name); }

 private:
  std::map<std::string, Tensor> tensors_;
  std::string source_, config_source_;
};

/// One tensor or linear module of a Hugging Face checkpoint, built from sqkit's canonical tensors
/// (core/checkpoint.h) by row operations only, so that the same entry serves float weights and
/// quantized ones (whose per-output-row scales, zero points and biases move with their rows).
///
///  * Tensor entry (`linear` false): HF tensor `name` = the rows of `sources` (canonical tensor
///    names, each rank 1 or 2, equal widths) concatenated along dim 0, then gathered by `rows`,
///    then `add` added to every element (Gemma's norms: −1 unfolds the (1 + w) sqkit folds in).
///  * Linear entry (`linear` true): HF module `name` (e.g. "model.layers.0.self_attn.qkv_proj") with
///    `NAME.weight` [out, in] (and `NAME.bias` [out] when any source has a bias, zeros for a source
///    without one, or always with `zero_bias`) whose rows are those of the canonical linears
///    `sources` (base names without ".weight", e.g. "model.layers.0.self_attn.q_proj")
///    concatenated, then gathered by `rows`. `conv1d`: the float weight is written transposed
///    [in, out] (GPT-2's Conv1D, not an nn.Linear: quantized exports refuse it).
///  * `rows` empty: the plain concatenation; else HF row r is concatenated row rows[r] (a fused
///    q/k/v interleaved per head, as BLOOM / GPT-NeoX / Falcon store it).
/// Writers apply one more row permutation themselves: q/k rows of a model whose rope_layout is
/// Interleaved are reordered to HF's half-split layout (permute_qk_rows_for_half_split).
struct HfPlanEntry {
  bool linear = false;
  std::string name;
  std::vector<std::string> sources;
  std::vector<int64_t> rows;
  bool zero_bias = false;
  bool conv1d = false;
  float add = 0.0f;
};

/// canonical tensor name -> FP32 tensor (core/checkpoint.h).
using CanonicalTensors = std::map<std::string, Tensor>;

/// One Hugging Face architecture (one file under formats/architectures/).
struct HfArchitecture {
  /// ModelConfig::architecture of the models it builds ("llama", "gpt2", ...).
  const char* name = nullptr;
  /// The transformers classes it reads (`architectures[0]`, e.g. "GPT2LMHeadModel").
  std::vector<std::string> classes;
  /// The `model_type` values it reads when `architectures` is absent.
  std::vector<std::string> model_types;
  /// Prefix of the base model's tensors in the *ForCausalLM checkpoint ("model.", "transformer.",
  /// "gpt_neox."): a checkpoint saved from the base model class (the original gpt2, bloom-560m,
  /// opt-125m files) has no tensor starting with it, and the loader then prepends it to every name.
  const char* base_prefix = "model.";
  /// Prefix of layer i's tensors, followed by "{i}." ("model.layers.", "transformer.h.").
  const char* layer_prefix = "model.layers.";
  /// The config key of the layer count (named when the tensors hold fewer layers).
  const char* layers_key = "num_hidden_layers";
  /// Fills `config` (which holds ModelConfig's defaults, architecture = name, rope_layout
  /// HalfSplit) from the config.json keys; the caller validates it afterwards. Throws InputError
  /// (missing required key, wrong JSON type) or UnsupportedError (a feature sqkit does not run),
  /// naming the file and key.
  void (*configure)(const HfConfigReader& config_json, ModelConfig& config) = nullptr;
  /// Reads the tensors `config` implies that `selection` selects (the globals when
  /// selection.globals, layer l's when selection.layer(l); a layer past config.n_layers is
  /// absent, not an error) from `source` by their HF names (HfTensorSource::get checks each
  /// shape, so a missing or misshapen tensor is an InputError naming file and tensor) and stores
  /// them in `out` under their canonical names, transformed where the layouts differ; no other
  /// tensor is read or widened. May refine `config` from tensor values (Llama: o_proj biases that
  /// are all zero are dropped); such a refinement reads what it needs from every layer, so
  /// `config` comes out the same whatever the selection.
  void (*map_tensors)(const HfTensorSource& source, const HfTensorSelection& selection, ModelConfig& config,
                      CanonicalTensors& out) = nullptr;
  /// Optional (null: sqkit does not write this architecture): the config.json object for
  /// `config`, without torch_dtype. Throws UnsupportedError for a config the class cannot express.
  nlohmann::ordered_json (*make_config)(const ModelConfig& config) = nullptr;
  /// Optional, with make_config: the write plan — every tensor and linear module of the HF
  /// checkpoint for `config`, in file order, each built from canonical tensors by row operations
  /// (HfPlanEntry). The float writer (save_hf_checkpoint) and the quantized exporters
  /// (formats/hf_export.h) share it: a linear entry moves a quantized weight's rows together with
  /// its per-row scales, zero points and bias. Throws UnsupportedError for a config the plan cannot
  /// express.
  std::vector<HfPlanEntry> (*hf_plan)(const ModelConfig& config) = nullptr;
};

/// Every architecture sqkit reads, in a fixed order (formats/architectures/registry.cpp).
const std::vector<HfArchitecture>& hf_architectures();

/// The architecture of a parsed config.json object: `architectures[0]` among the classes of
/// hf_architectures(), or, when `architectures` is absent or null, `model_type` among their model
/// types. Throws UnsupportedError "SOURCE: architectures[0] = 'X' is not supported (expected A, B
/// or C)" (or model_type = 'x'), InputError when `architectures` is not a non-empty list of
/// strings or both keys are absent.
const HfArchitecture& hf_architecture_for(const nlohmann::json& config, const std::string& source);

/// The architecture whose `name` is `name` (ModelConfig::architecture), or nullptr.
const HfArchitecture* hf_architecture_named(const std::string& name);

}  // namespace sq
