#include "formats/architectures/common.h"

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "formats/hf_config.h"
#include "formats/json_limits.h"

namespace sq::hf {

// ---- config --------------------------------------------------------------------------------------

Activation activation(const HfConfigReader& r, const char* key, const std::string& fallback) {
  const std::string a = r.string(key, fallback);
  if (a == "silu" || a == "swish") return Activation::SiLU;
  if (a == "gelu") return Activation::Gelu;
  if (a == "gelu_new" || a == "gelu_pytorch_tanh") return Activation::GeluTanh;
  if (a == "relu") return Activation::ReLU;
  r.refuse(key, "'silu', 'gelu', 'gelu_new', 'gelu_pytorch_tanh' or 'relu'");
}

void token_ids(const HfConfigReader& r, ModelConfig& c, int bos, int eos) {
  const ModelConfig defaults;
  auto in_vocab = [&](int id, int fallback) { return id >= 0 && id < c.vocab_size ? id : fallback; };
  c.bos_id = in_vocab(r.token_id("bos_token_id", bos), defaults.bos_id);
  c.eos_id = in_vocab(r.token_id("eos_token_id", eos), defaults.eos_id);
}

void head_dim(const HfConfigReader& r, ModelConfig& c, const char* dim_key, const char* heads_key) {
  if (r.present("head_dim")) {
    c.head_dim = r.integer("head_dim", nullptr);
    return;
  }
  if (c.n_heads > 0 && c.dim % c.n_heads != 0)
    throw InputError(r.source() + ": " + dim_key + " (" + std::to_string(c.dim) + ") is not a multiple of " + heads_key +
                     " (" + std::to_string(c.n_heads) + ") and no head_dim is given");
  c.head_dim = c.n_heads > 0 ? c.dim / c.n_heads : 0;
}

void rope(const HfConfigReader& r, ModelConfig& c, const HfRopeOptions& options) {
  const HfRope p = parse_hf_rope(r.json(), r.source(), options);
  c.rope_theta = p.theta;
  c.rope_scaling = p.scaling;
  if (p.partial_rotary_factor == 1.0) return;
  // transformers: rotary_ndims = int(head_size * partial_rotary_factor), in double precision.
  const int rotated = int(double(c.head_dim) * p.partial_rotary_factor);
  if (rotated <= 0 || rotated % 2 != 0)
    throw InputError(r.source() + ": partial_rotary_factor " + std::to_string(p.partial_rotary_factor) + " of head_dim " +
                     std::to_string(c.head_dim) + " rotates " + std::to_string(rotated) +
                     " channels (must be even and positive)");
  c.spec.rope_dim = rotated < c.head_dim ? rotated : 0;
}

std::vector<bool> all_layers(const ModelConfig& c, const std::string& source) {
  if (c.n_layers > kMaxLayersForLists)
    throw InputError(source + ": " + std::to_string(c.n_layers) + " layers is more than the " +
                     std::to_string(kMaxLayersForLists) + " a per-layer attention window list is built for");
  return std::vector<bool>(static_cast<size_t>(c.n_layers > 0 ? c.n_layers : 0), true);
}

std::vector<bool> sliding_layers(const HfConfigReader& r, const ModelConfig& c, std::vector<bool> fallback) {
  if (!r.present("layer_types")) return fallback;
  const nlohmann::json& types = r.json().at("layer_types");
  if (!types.is_array() || types.size() != static_cast<size_t>(c.n_layers < 0 ? 0 : c.n_layers))
    throw InputError(r.source() + ": key '" + r.name("layer_types") + "' must be a list of " + std::to_string(c.n_layers) +
                     " layer types (one per layer), got " + json_excerpt(types));
  std::vector<bool> sliding;
  for (const auto& t : types) {
    if (!t.is_string())
      throw InputError(r.source() + ": key '" + r.name("layer_types") + "' must hold strings, got " + json_excerpt(t));
    const std::string s = t.get<std::string>();
    if (s != "sliding_attention" && s != "full_attention")
      throw UnsupportedError(r.source() + ": " + r.name("layer_types") + " holds '" + s +
                             "', which is not supported (expected 'full_attention' or 'sliding_attention')");
    sliding.push_back(s == "sliding_attention");
  }
  return sliding;
}

void set_windows(ModelConfig& c, const std::vector<bool>& sliding, int window, const std::string& source) {
  if (window < 0) throw InputError(source + ": sliding_window must be non-negative, got " + std::to_string(window));
  c.spec.layer_window.clear();
  // A window covering the trained context never masks anything there: global attention.
  if (window == 0 || window >= c.max_seq_len) return;
  bool any = false;
  for (bool s : sliding) any = any || s;
  if (!any) return;
  if (sliding.size() > size_t(kMaxLayersForLists))
    throw InputError(source + ": " + std::to_string(sliding.size()) + " layers is more than the " +
                     std::to_string(kMaxLayersForLists) + " a per-layer attention window list is built for");
  for (bool s : sliding) c.spec.layer_window.push_back(s ? window : 0);
}

// ---- tensors -------------------------------------------------------------------------------------

Tensor rows(const Tensor& t, int64_t begin, int64_t count) {
  const int64_t cols = t.rank() == 2 ? t.dim(1) : 1;
  std::vector<int64_t> shape = t.shape();
  shape[0] = count;
  return Tensor::view(std::move(shape), t.data() + begin * cols, std::make_shared<const Tensor>(t));
}

std::vector<Tensor> split_rows(const Tensor& t, const std::vector<int64_t>& counts) {
  std::vector<Tensor> out;
  int64_t begin = 0;
  for (int64_t n : counts) {
    out.push_back(rows(t, begin, n));
    begin += n;
  }
  if (begin != t.dim(0))
    throw std::logic_error("split_rows: row counts add up to " + std::to_string(begin) + ", tensor has " +
                           std::to_string(t.dim(0)));
  return out;
}

Tensor transpose(const Tensor& t) {
  const int64_t a = t.dim(0), b = t.dim(1);
  Tensor out = Tensor::zeros({b, a});
  const float* s = t.data();
  float* d = out.mutable_data();
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j) d[j * a + i] = s[i * b + j];
  return out;
}

namespace {

/// Copies `n` rows of `cols` floats from row `from` of `src` to row `to` of `dst`.
void copy_rows(const Tensor& src, int64_t from, Tensor& dst, int64_t to, int64_t n) {
  const int64_t cols = src.rank() == 2 ? src.dim(1) : 1;
  std::memcpy(dst.mutable_data() + to * cols, src.data() + from * cols, size_t(n * cols) * sizeof(float));
}

std::vector<int64_t> with_rows(const Tensor& t, int64_t n) {
  std::vector<int64_t> s = t.shape();
  s[0] = n;
  return s;
}

}  // namespace

std::array<Tensor, 3> split_qkv_per_head(const Tensor& t, int n_heads, int head_dim) {
  const int64_t hd = head_dim, rows_each = int64_t(n_heads) * hd;
  if (t.dim(0) != 3 * rows_each) throw std::logic_error("split_qkv_per_head: " + t.shape_string());
  std::array<Tensor, 3> out;
  for (auto& o : out) o = Tensor::zeros(with_rows(t, rows_each));
  for (int64_t h = 0; h < n_heads; ++h)
    for (int j = 0; j < 3; ++j) copy_rows(t, (h * 3 + j) * hd, out[size_t(j)], h * hd, hd);
  return out;
}

std::array<Tensor, 3> split_qkv_per_group(const Tensor& t, int n_kv, int q_per_kv, int head_dim) {
  const int64_t hd = head_dim, group = int64_t(q_per_kv + 2) * hd;
  if (t.dim(0) != n_kv * group) throw std::logic_error("split_qkv_per_group: " + t.shape_string());
  std::array<Tensor, 3> out = {Tensor::zeros(with_rows(t, int64_t(n_kv) * q_per_kv * hd)),
                               Tensor::zeros(with_rows(t, int64_t(n_kv) * hd)),
                               Tensor::zeros(with_rows(t, int64_t(n_kv) * hd))};
  for (int64_t g = 0; g < n_kv; ++g) {
    copy_rows(t, g * group, out[0], g * q_per_kv * hd, q_per_kv * hd);
    copy_rows(t, g * group + q_per_kv * hd, out[1], g * hd, hd);
    copy_rows(t, g * group + (q_per_kv + 1) * hd, out[2], g * hd, hd);
  }
  return out;
}

Tensor one_plus(const Tensor& w) {
  Tensor out = Tensor::zeros(w.shape());
  for (int64_t i = 0; i < w.numel(); ++i) out.mutable_data()[i] = 1.0f + w.data()[i];
  return out;
}

void copy(const HfTensorSource& src, CanonicalTensors& out, const std::string& to, const std::string& from,
          const std::vector<int64_t>& shape) {
  out[to] = src.get(from, shape);
}

void copy_llama_globals(const HfTensorSource& src, const ModelConfig& c, CanonicalTensors& out) {
  copy(src, out, names::kEmbed, names::kEmbed, {c.vocab_size, c.dim});
  copy(src, out, names::kFinalNorm, names::kFinalNorm, {c.dim});
  if (!c.tied_embeddings) copy(src, out, names::kLmHead, names::kLmHead, {c.vocab_size, c.dim});
}

void copy_llama_attention(const HfTensorSource& src, const ModelConfig& c, int l, CanonicalTensors& out) {
  const std::string a = names::layer(l) + "self_attn.";
  const int64_t d = c.dim, q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim;
  for (const auto& [proj, rows_] : {std::pair<const char*, int64_t>{"q_proj", q}, {"k_proj", kv}, {"v_proj", kv}}) {
    const std::string n = a + proj;
    copy(src, out, n + ".weight", n + ".weight", {rows_, d});
    if (c.qkv_bias) copy(src, out, n + ".bias", n + ".bias", {rows_});
  }
  copy(src, out, a + "o_proj.weight", a + "o_proj.weight", {d, q});
  if (c.spec.o_bias) copy(src, out, a + "o_proj.bias", a + "o_proj.bias", {d});
}

void copy_llama_mlp(const HfTensorSource& src, const ModelConfig& c, int l, CanonicalTensors& out) {
  const std::string m = names::layer(l) + "mlp.";
  const int64_t d = c.dim, h = c.hidden_dim;
  for (const auto& [proj, shape] : {std::pair<const char*, std::vector<int64_t>>{"gate_proj", {h, d}},
                                    {"up_proj", {h, d}},
                                    {"down_proj", {d, h}}}) {
    const std::string n = m + proj;
    copy(src, out, n + ".weight", n + ".weight", shape);
    if (c.spec.mlp_bias) copy(src, out, n + ".bias", n + ".bias", {shape[0]});
  }
}

void copy_llama_norms(const HfTensorSource& src, const ModelConfig& c, int l, CanonicalTensors& out) {
  const std::string p = names::layer(l);
  copy(src, out, p + "input_layernorm.weight", p + "input_layernorm.weight", {c.dim});
  copy(src, out, p + "post_attention_layernorm.weight", p + "post_attention_layernorm.weight", {c.dim});
}

void map_llama_tensors(const HfTensorSource& src, const HfTensorSelection& selection, ModelConfig& c,
                       CanonicalTensors& out) {
  if (selection.globals) copy_llama_globals(src, c, out);
  for (int l = 0; l < c.n_layers; ++l) {
    if (!selection.layer(l)) continue;
    copy_llama_norms(src, c, l, out);
    copy_llama_attention(src, c, l, out);
    copy_llama_mlp(src, c, l, out);
  }
}

// ---- the LLaMA family ----------------------------------------------------------------------------

void configure_llama_like(const HfConfigReader& r, ModelConfig& c, const LlamaDefaults& d,
                          const HfRopeOptions& rope_options) {
  c.dim = r.integer("hidden_size", nullptr);
  c.hidden_dim = r.integer("intermediate_size", nullptr);
  c.n_layers = r.integer("num_hidden_layers", nullptr);
  c.n_heads = r.integer("num_attention_heads", nullptr);
  c.n_kv_heads = r.integer("num_key_value_heads", c.n_heads);
  head_dim(r, c, "hidden_size", "num_attention_heads");
  c.vocab_size = r.integer("vocab_size", d.vocab_size);
  c.max_seq_len = r.integer("max_position_embeddings", d.max_position_embeddings);
  c.norm_eps = r.number_f32("rms_norm_eps", d.rms_norm_eps);
  rope(r, c, rope_options);
  c.tied_embeddings = r.boolean("tie_word_embeddings", d.tie_word_embeddings);
  token_ids(r, c, d.bos, d.eos);
  c.spec.activation = activation(r, "hidden_act", "silu");
}

nlohmann::ordered_json number_json(float v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return nlohmann::ordered_json(std::strtod(std::string(buf, res.ptr).c_str(), nullptr));
}

namespace {
nlohmann::ordered_json float_json(float v) { return number_json(v); }
}  // namespace

nlohmann::ordered_json llama_like_config_json(const ModelConfig& c, const char* class_name, const char* model_type,
                                              bool windows, bool o_bias) {
  DecoderSpec expressible = c.spec;
  if (windows) expressible.layer_window.clear();
  if (o_bias && c.qkv_bias) expressible.o_bias = false;
  expressible.activation = Activation::SiLU;  // hidden_act
  if (expressible != DecoderSpec{})
    throw UnsupportedError("cannot write a Hugging Face " + std::string(class_name) + " config for this model: its layer " +
                           "structure (norms, positions, biases or MLP) is not " + class_name + "'s");
  int window = 0;
  for (int w : c.spec.layer_window) {
    if (w == 0 || (window != 0 && w != window))
      throw UnsupportedError("cannot write a Hugging Face " + std::string(class_name) +
                             " config with different sliding windows per layer");
    window = w;
  }
  static const char* kActs[] = {"silu", "gelu_pytorch_tanh", "gelu", "relu"};
  nlohmann::ordered_json j;
  j["architectures"] = {class_name};
  j["model_type"] = model_type;
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.hidden_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = float_json(c.norm_eps);
  j["rope_theta"] = float_json(c.rope_theta);
  // Legacy rope_scaling (+ top-level rope_theta): read by transformers 4 and 5 alike.
  if (c.rope_scaling.is_default()) {
    j["rope_scaling"] = nullptr;
  } else {
    nlohmann::ordered_json rs;
    rs["rope_type"] = rope_scaling_type_name(c.rope_scaling.type);
    rs["factor"] = float_json(c.rope_scaling.factor);
    if (c.rope_scaling.type == RopeScalingType::Llama3) {
      rs["low_freq_factor"] = float_json(c.rope_scaling.low_freq_factor);
      rs["high_freq_factor"] = float_json(c.rope_scaling.high_freq_factor);
      rs["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    }
    j["rope_scaling"] = std::move(rs);
  }
  j["hidden_act"] = kActs[static_cast<int>(c.spec.activation)];
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["bos_token_id"] = c.bos_id;
  j["eos_token_id"] = c.eos_id;
  if (windows) j["sliding_window"] = window > 0 ? nlohmann::ordered_json(window) : nlohmann::ordered_json(nullptr);
  return j;
}

HfPlanEntry plan_tensor(const std::string& name) {
  HfPlanEntry e;
  e.name = name;
  e.sources = {name};
  return e;
}

HfPlanEntry plan_tensor(const std::string& name, const std::string& source, float add) {
  HfPlanEntry e;
  e.name = name;
  e.sources = {source};
  e.add = add;
  return e;
}

HfPlanEntry plan_linear(const std::string& name, std::vector<std::string> sources) {
  HfPlanEntry e;
  e.linear = true;
  e.name = name;
  e.sources = sources.empty() ? std::vector<std::string>{name} : std::move(sources);
  return e;
}

std::vector<HfPlanEntry> llama_like_hf_plan(const ModelConfig& c) {
  std::vector<HfPlanEntry> out;
  out.push_back(plan_tensor(names::kEmbed));
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = names::layer(i), a = p + "self_attn.";
    out.push_back(plan_tensor(p + "input_layernorm.weight"));
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) out.push_back(plan_linear(a + proj));
    out.push_back(plan_tensor(p + "post_attention_layernorm.weight"));
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) out.push_back(plan_linear(p + "mlp." + proj));
  }
  out.push_back(plan_tensor(names::kFinalNorm));
  if (!c.tied_embeddings) out.push_back(plan_linear("lm_head"));
  return out;
}

// ---- writing -------------------------------------------------------------------------------------

const char* hf_activation_name(Activation a) {
  switch (a) {
    case Activation::SiLU: return "silu";
    case Activation::GeluTanh: return "gelu_pytorch_tanh";
    case Activation::Gelu: return "gelu";
    case Activation::ReLU: return "relu";
  }
  return "silu";
}

nlohmann::ordered_json rope_parameters_json(const ModelConfig& c, bool partial) {
  nlohmann::ordered_json p;
  p["rope_type"] = rope_scaling_type_name(c.rope_scaling.type);
  p["rope_theta"] = number_json(c.rope_theta);
  if (!c.rope_scaling.is_default()) {
    p["factor"] = number_json(c.rope_scaling.factor);
    if (c.rope_scaling.type == RopeScalingType::Llama3) {
      p["low_freq_factor"] = number_json(c.rope_scaling.low_freq_factor);
      p["high_freq_factor"] = number_json(c.rope_scaling.high_freq_factor);
      p["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    }
  }
  if (partial) p["partial_rotary_factor"] = c.spec.rope_dim > 0 ? double(c.spec.rope_dim) / double(c.head_dim) : 1.0;
  return p;
}

void check_config_reads_back(const nlohmann::ordered_json& config_json, const ModelConfig& c) {
  const std::string cls = config_json.at("architectures")[0].get<std::string>();
  ModelConfig r;
  try {
    r = parse_hf_config(nlohmann::json::parse(config_json.dump()), cls + " config.json");
  } catch (const Error& e) {
    throw UnsupportedError("cannot write a Hugging Face " + cls + " config for this model: " + e.what());
  }
  auto refuse = [&](const std::string& field) {
    throw UnsupportedError("cannot write a Hugging Face " + cls + " config for this model: its " + field +
                           " cannot be expressed in " + cls + "'s config keys");
  };
  if (r.architecture != c.architecture) refuse("architecture '" + c.architecture + "'");
  if (r.dim != c.dim || r.hidden_dim != c.hidden_dim || r.n_layers != c.n_layers || r.n_heads != c.n_heads ||
      r.n_kv_heads != c.n_kv_heads || r.head_dim != c.head_dim || r.vocab_size != c.vocab_size)
    refuse("shape (sizes, heads, head_dim)");
  if (r.max_seq_len != c.max_seq_len) refuse("context length " + std::to_string(c.max_seq_len));
  if (r.norm_eps != c.norm_eps) refuse("norm epsilon " + std::to_string(c.norm_eps));
  if (r.rope_theta != c.rope_theta || !(r.rope_scaling == c.rope_scaling)) refuse("RoPE (theta / scaling)");
  if (r.tied_embeddings != c.tied_embeddings) refuse(c.tied_embeddings ? "tied head" : "untied head");
  if (r.qkv_bias != c.qkv_bias) refuse(c.qkv_bias ? "q/k/v biases" : "missing q/k/v biases");
  if (r.bos_id != c.bos_id || r.eos_id != c.eos_id) refuse("bos / eos token ids");
  const DecoderSpec &a = r.spec, &b = c.spec;
  if (a.norm != b.norm || a.norm_bias != b.norm_bias) refuse("norm kind");
  if (a.post_attn_norm != b.post_attn_norm || a.post_ffn_norm != b.post_ffn_norm || a.qk_norm != b.qk_norm) refuse("extra norms");
  if (a.parallel_residual != b.parallel_residual || a.shared_input_norm != b.shared_input_norm) refuse("residual structure");
  if (a.position != b.position || a.rope_dim != b.rope_dim || a.learned_position_offset != b.learned_position_offset)
    refuse("position encoding");
  if (a.attn_scale != b.attn_scale) refuse("attention scale");
  if (a.o_bias != b.o_bias) refuse(b.o_bias ? "output projection bias" : "missing output projection bias");
  if (a.mlp_gated != b.mlp_gated || a.activation != b.activation || a.mlp_bias != b.mlp_bias) refuse("MLP (gating, activation, biases)");
  if (a.n_experts != b.n_experts || a.experts_per_token != b.experts_per_token) refuse("experts");
  if (a.embed_scale != b.embed_scale || a.embed_norm != b.embed_norm) refuse("embedding scale / norm");
  if (a.layer_window != b.layer_window || a.rope_local_theta != b.rope_local_theta) refuse("sliding windows");
  if (!(a == b)) refuse("layer structure");
}

std::vector<int64_t> qkv_per_group_rows(int n_kv, int q_per_kv, int head_dim) {
  const int64_t hd = head_dim, q_rows = int64_t(n_kv) * q_per_kv * hd, kv_rows = int64_t(n_kv) * hd;
  std::vector<int64_t> rows;
  rows.reserve(size_t(q_rows + 2 * kv_rows));
  for (int64_t g = 0; g < n_kv; ++g) {
    for (int64_t i = 0; i < q_per_kv * hd; ++i) rows.push_back(g * q_per_kv * hd + i);
    for (int64_t i = 0; i < hd; ++i) rows.push_back(q_rows + g * hd + i);
    for (int64_t i = 0; i < hd; ++i) rows.push_back(q_rows + kv_rows + g * hd + i);
  }
  return rows;
}

}  // namespace sq::hf
