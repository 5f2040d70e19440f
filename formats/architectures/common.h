// Helpers shared by the architecture files of formats/architectures/ (formats/hf_architecture.h):
// config keys every transformers class spells the same way, and the tensor transforms (row
// splits, transposes, per-head de-interleaving) that map fused HF weights onto canonical ones.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "core/checkpoint.h"
#include "formats/hf_architecture.h"
#include "formats/hf_rope_config.h"

namespace sq::hf {

// ---- config --------------------------------------------------------------------------------------

/// The activation named by `key` (transformers' ACT2FN names; `fallback` when absent): "silu" /
/// "swish" -> SiLU, "gelu" -> Gelu (exact erf), "gelu_new" / "gelu_pytorch_tanh" -> GeluTanh,
/// "relu" -> ReLU. Throws UnsupportedError naming the key and value for any other name.
Activation activation(const HfConfigReader& r, const char* key, const std::string& fallback);

/// Sets c.bos_id / c.eos_id from bos_token_id / eos_token_id (a list: its first id), the class
/// defaults `bos` / `eos` when absent or null. An id outside [0, c.vocab_size) (tiny test models
/// keep GPT-2's 50256 with a 320-token vocabulary; MPT has none) becomes ModelConfig's default
/// (1 / 2): ModelConfig has no "no such token", and transformers never uses these ids in a forward
/// pass. Call after c.vocab_size is set. Throws InputError for a non-integer id.
void token_ids(const HfConfigReader& r, ModelConfig& c, int bos, int eos);

/// c.head_dim = the config's `head_dim` when present and not null, else dim / n_heads; throws
/// InputError naming `dim_key` and `heads_key` when that division is not exact.
void head_dim(const HfConfigReader& r, ModelConfig& c, const char* dim_key, const char* heads_key);

/// RoPE of the config (parse_hf_rope with `options`): c.rope_theta, c.rope_scaling, and
/// c.spec.rope_dim = int(head_dim × partial_rotary_factor) when that is below head_dim (0 = all).
/// Call after c.head_dim is set. Throws what parse_hf_rope throws, and InputError when the
/// rotated dimension is odd or zero.
void rope(const HfConfigReader& r, ModelConfig& c, const HfRopeOptions& options = {});

/// Whether each layer is a sliding-window layer, from `layer_types` ("sliding_attention" /
/// "full_attention") when present, else `fallback` (one entry per layer, or empty = none).
/// Throws InputError when layer_types is not a list of c.n_layers strings, UnsupportedError for
/// another layer type (e.g. "chunked_attention").
std::vector<bool> sliding_layers(const HfConfigReader& r, const ModelConfig& c, std::vector<bool> fallback);

/// Largest n_layers for which a per-layer list is built from the config alone (InputError above):
/// the layer count is checked against the tensors only later, and a hostile config.json must not
/// allocate gigabytes first.
constexpr int kMaxLayersForLists = 1 << 16;

/// Sets c.spec.layer_window: `window` on the layers where sliding[l], 0 elsewhere. A window of 0,
/// or one of at least c.max_seq_len tokens (it never masks a key within the trained context), is
/// global; when every layer is global the list stays empty (the LLaMA structure). Throws
/// InputError for a negative window or more than kMaxLayersForLists layers.
void set_windows(ModelConfig& c, const std::vector<bool>& sliding, int window, const std::string& source);

/// The first `n` entries true (every layer sliding), for set_windows. Throws InputError above
/// kMaxLayersForLists naming `source`.
std::vector<bool> all_layers(const ModelConfig& c, const std::string& source);

// ---- tensors -------------------------------------------------------------------------------------

/// Rows [begin, begin + count) of a rank-1 or rank-2 tensor, as a view sharing `t`'s storage.
Tensor rows(const Tensor& t, int64_t begin, int64_t count);

/// Consecutive row blocks of `t` with the given row counts (which must add up to t.dim(0)).
std::vector<Tensor> split_rows(const Tensor& t, const std::vector<int64_t>& counts);

/// The transpose of a rank-2 tensor [a, b] -> [b, a] (owned). GPT-2's Conv1D stores [in, out].
Tensor transpose(const Tensor& t);

/// Fused q/k/v rows stored per head, [q_h; k_h; v_h] for h = 0 … n_heads−1 (GPT-NeoX, BLOOM,
/// Falcon without multi_query: `view(n_heads, 3, head_dim, in)`): returns q, k, v, each
/// [n_heads·head_dim (, in)] (owned). `t` must have 3·n_heads·head_dim rows.
std::array<Tensor, 3> split_qkv_per_head(const Tensor& t, int n_heads, int head_dim);

/// Fused q/k/v rows stored per key/value group, [q_{g,0} … q_{g,r−1}; k_g; v_g] for g = 0 …
/// n_kv−1, r = q_per_kv (Falcon new_decoder_architecture: `view(n_kv, r + 2, head_dim, in)`):
/// returns q [n_kv·r·head_dim], k and v [n_kv·head_dim] (owned).
std::array<Tensor, 3> split_qkv_per_group(const Tensor& t, int n_kv, int q_per_kv, int head_dim);

/// 1.0f + w element-wise in FP32 (owned): Gemma's RMSNorm multiplies by (1 + w), computed by
/// transformers as `1.0 + w.float()` in FP32, so folding it into the weight is bit-identical.
Tensor one_plus(const Tensor& w);

/// Copies HF tensor `from` (shape checked) to canonical `to`.
void copy(const HfTensorSource& src, CanonicalTensors& out, const std::string& to, const std::string& from,
          const std::vector<int64_t>& shape);

/// The tensors of the LLaMA layout, whose HF names are the canonical ones (Llama, Mistral, Qwen2,
/// Mixtral, Phi-3, Gemma 3 share them): model.embed_tokens, model.norm and, when untied, lm_head.
void copy_llama_globals(const HfTensorSource& src, const ModelConfig& c, CanonicalTensors& out);
/// Layer l's self_attn.{q,k,v}_proj (+ biases when c.qkv_bias) and o_proj (+ bias when spec.o_bias).
void copy_llama_attention(const HfTensorSource& src, const ModelConfig& c, int l, CanonicalTensors& out);
/// Layer l's mlp.{gate,up,down}_proj (+ biases when spec.mlp_bias).
void copy_llama_mlp(const HfTensorSource& src, const ModelConfig& c, int l, CanonicalTensors& out);
/// Layer l's input_layernorm and post_attention_layernorm weights.
void copy_llama_norms(const HfTensorSource& src, const ModelConfig& c, int l, CanonicalTensors& out);
/// The LLaMA layout (Llama, Mistral, Qwen2): copy_llama_globals when selection.globals, then the
/// norms, attention and MLP of every selected layer. Usable as HfArchitecture::map_tensors.
void map_llama_tensors(const HfTensorSource& src, const HfTensorSelection& selection, ModelConfig& c,
                       CanonicalTensors& out);

// ---- the LLaMA family (Llama, Mistral, Qwen2, Mixtral, Phi-3) -----------------------------------

/// Defaults of one LLaMA-like transformers config class.
struct LlamaDefaults {
  int vocab_size;
  int max_position_embeddings;
  float rms_norm_eps;
  int bos, eos;
  bool tie_word_embeddings = false;
};

/// The keys the LLaMA-like classes share: hidden_size, intermediate_size, num_hidden_layers,
/// num_attention_heads (required), num_key_value_heads (default: num_attention_heads), head_dim,
/// vocab_size, max_position_embeddings, rms_norm_eps, RoPE (`rope`), tie_word_embeddings, token ids,
/// hidden_act (gated MLP, default silu). Throws as HfConfigReader and `rope` do.
void configure_llama_like(const HfConfigReader& r, ModelConfig& c, const LlamaDefaults& d,
                          const HfRopeOptions& rope_options = {});

/// config.json of a LLaMA-family model for save_hf_checkpoint: `class_name` / `model_type` and the
/// keys configure_llama_like reads (RoPE as top-level rope_theta + legacy rope_scaling). Throws
/// UnsupportedError for a structure those keys cannot express (any DecoderSpec field but the ones
/// the caller allows: `windows` allows a uniform sliding window, `o_bias` an o_proj bias with
/// q/k/v biases).
nlohmann::ordered_json llama_like_config_json(const ModelConfig& c, const char* class_name, const char* model_type,
                                              bool windows, bool o_bias);

/// The write plan of the LLaMA layout in HF save order (Llama, Mistral, Qwen2): every name is the
/// canonical one; linears q/k/v/o (biases when c.qkv_bias / spec.o_bias), gate/up/down. Usable as
/// HfArchitecture::hf_plan.
std::vector<HfPlanEntry> llama_like_hf_plan(const ModelConfig& c);

/// A plan entry copying canonical tensor `name` under the same name.
HfPlanEntry plan_tensor(const std::string& name);
/// A plan entry writing canonical tensor `source` as HF tensor `name`, `add` added to every
/// element (Gemma's norms: −1).
HfPlanEntry plan_tensor(const std::string& name, const std::string& source, float add = 0.0f);
/// A plan entry for linear module `name` whose rows are those of canonical linears `sources`
/// (default: the linear of the same name).
HfPlanEntry plan_linear(const std::string& name, std::vector<std::string> sources = {});

// ---- writing (make_config / hf_plan of the architecture files) -----------------------------------

/// transformers' ACT2FN name of `a`: "silu", "gelu_pytorch_tanh", "gelu" or "relu" (what
/// `activation` reads back as `a`).
const char* hf_activation_name(Activation a);

/// The shortest decimal that parses back to the same float, as a JSON number.
nlohmann::ordered_json number_json(float v);

/// A transformers-5 `rope_parameters` object for c.rope_theta and c.rope_scaling (rope_type,
/// rope_theta, and factor / llama3 keys), with partial_rotary_factor = spec.rope_dim / head_dim
/// when `partial` (1 when spec.rope_dim is 0).
nlohmann::ordered_json rope_parameters_json(const ModelConfig& c, bool partial);

/// Checks that `config_json` (a make_config result) reads back as `c`: parses it with
/// parse_hf_config and compares every field but rope_layout (sizes, norm eps, RoPE, tied head,
/// biases, token ids, the DecoderSpec). Throws UnsupportedError "cannot write a Hugging Face CLASS
/// config for this model: its FIELD (...) cannot be expressed" for the first field that differs,
/// so a structure the class cannot express is refused by name instead of written wrong.
void check_config_reads_back(const nlohmann::ordered_json& config_json, const ModelConfig& c);

/// Row gather of a fused q/k/v linear stored per key/value group (the inverse of
/// split_qkv_per_group): HF row order [q_{g,0} … q_{g,r−1}; k_g; v_g] for g = 0 … n_kv−1, r =
/// q_per_kv, as rows of the concatenation [q (n_kv·r·head_dim); k; v]. Per-head interleaving
/// (BLOOM, GPT-NeoX, Falcon without multi_query) is q_per_kv = 1, n_kv = n_heads; Falcon's
/// multi-query layout is one group.
std::vector<int64_t> qkv_per_group_rows(int n_kv, int q_per_kv, int head_dim);

}  // namespace sq::hf
