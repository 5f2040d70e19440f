#include "calib/smoothing_mappings.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>

namespace sq {

namespace {

/// A private, writable copy of tensor `name` in `ck`. Always a clone: Tensor copies are shallow, so
/// even an owned tensor may share its storage with the loaded checkpoint, its Decoder, or a copy of
/// the layer kept for the α search, none of which may change.
const Tensor& tensor_at(const Checkpoint& ck, const std::string& name) {
  auto it = ck.tensors.find(name);
  if (it == ck.tensors.end()) throw std::out_of_range("smoothing: tensor " + name + " is not in the checkpoint");
  return it->second;
}

Tensor& private_copy(Checkpoint& ck, const std::string& name) {
  tensor_at(ck, name);
  Tensor& t = ck.tensors.at(name);
  t = t.clone();
  return t;
}

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, SmoothingMappingsFn>& registry() {
  static std::map<std::string, SmoothingMappingsFn> r;
  return r;
}

/// A norm's smooth tensors: its weight, and its bias when the model's norms have biases.
std::vector<std::string> norm_tensors(const DecoderSpec& sp, const std::string& base) {
  std::vector<std::string> t = {base + ".weight"};
  if (sp.norm_bias) t.push_back(base + ".bias");
  return t;
}

/// A linear's smooth tensors: its weight (rows), and its bias when it has one.
std::vector<std::string> linear_rows(const std::string& base, bool bias) {
  std::vector<std::string> t = {base + ".weight"};
  if (bias) t.push_back(base + ".bias");
  return t;
}

/// The linears that read the FFN input: gate+up (gated), fc1 (plain), or router + every expert's
/// gate+up (mixture of experts: the router reads the same input and must see the same function).
std::vector<std::string> ffn_input_linears(const ModelConfig& c, const std::string& p) {
  const DecoderSpec& sp = c.spec;
  if (sp.n_experts > 0) {
    std::vector<std::string> b = {p + "mlp.router"};
    for (int e = 0; e < sp.n_experts; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      b.push_back(x + "gate_proj");
      b.push_back(x + "up_proj");
    }
    return b;
  }
  if (sp.mlp_gated) return {p + "mlp.gate_proj", p + "mlp.up_proj"};
  return {p + "mlp.up_proj"};
}

}  // namespace

bool SmoothingSelection::selects(const SmoothingMapping& m) const {
  switch (m.site) {
    case ActivationSite::AttnInput:
    case ActivationSite::FfnInput: return true;
    case ActivationSite::AttnOutput: return attn_output;
    case ActivationSite::FfnHidden: return ffn_hidden;
  }
  return false;
}

std::vector<SmoothingMapping> default_smoothing_mappings(const ModelConfig& c) {
  const DecoderSpec& sp = c.spec;
  std::vector<SmoothingMapping> out;
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = names::layer(l), a = p + "self_attn.";
    // Input norm → q, k, v; a parallel block's shared input norm also feeds the FFN inputs, which
    // therefore share the one factor vector (their FfnInput statistics equal the AttnInput ones).
    SmoothingMapping in{l, ActivationSite::AttnInput, norm_tensors(sp, p + "input_layernorm"), {a + "q_proj", a + "k_proj", a + "v_proj"}, {}};
    if (sp.shared_input_norm) {
      const auto ffn = ffn_input_linears(c, p);
      in.balance.insert(in.balance.end(), ffn.begin(), ffn.end());
    }
    out.push_back(std::move(in));
    // FFN norm (post_attention_layernorm; a parallel block's second input norm) → FFN inputs.
    if (!sp.shared_input_norm)
      out.push_back({l, ActivationSite::FfnInput, norm_tensors(sp, p + "post_attention_layernorm"), ffn_input_linears(c, p), {}});
    // v → o: exact for MHA, GQA and MQA with one factor per KV channel (balance_channel maps each
    // o_proj input column (h, i) to KV channel (h / group, i)).
    {
      SmoothingMapping vo{l, ActivationSite::AttnOutput, linear_rows(a + "v_proj", c.qkv_bias), {a + "o_proj"}, {}};
      if (c.n_kv_heads != c.n_heads) {
        const int group = c.n_heads / c.n_kv_heads;
        vo.balance_channel.resize(size_t(c.n_heads) * size_t(c.head_dim));
        for (int h = 0; h < c.n_heads; ++h)
          for (int i = 0; i < c.head_dim; ++i) vo.balance_channel[size_t(h) * c.head_dim + i] = (h / group) * c.head_dim + i;
      }
      out.push_back(std::move(vo));
    }
    // up → down: exact through a gated MLP (linear in up's output) and through a plain ReLU MLP
    // (ReLU is positively homogeneous and the factors are positive); not through plain GELU/SiLU.
    // Experts have no per-expert hidden statistics (one FfnHidden site per layer): not mapped.
    if (sp.n_experts == 0 && (sp.mlp_gated || sp.activation == Activation::ReLU))
      out.push_back({l, ActivationSite::FfnHidden, linear_rows(p + "mlp.up_proj", sp.mlp_bias), {p + "mlp.down_proj"}, {}});
  }
  return out;
}

void register_smoothing_mappings(const std::string& architecture, SmoothingMappingsFn fn) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  if (fn)
    registry()[architecture] = fn;
  else
    registry().erase(architecture);
}

std::vector<SmoothingMapping> smoothing_mappings(const ModelConfig& config) {
  SmoothingMappingsFn fn = nullptr;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(config.architecture);
    if (it != registry().end()) fn = it->second;
  }
  return fn ? fn(config) : default_smoothing_mappings(config);
}

std::vector<SmoothingMapping> layer_smoothing_mappings(const ModelConfig& config, int layer, const SmoothingSelection& select) {
  std::vector<SmoothingMapping> out;
  for (auto& m : smoothing_mappings(config))
    if (m.layer == layer && select.selects(m)) out.push_back(std::move(m));
  return out;
}

SmoothingMapping smoothing_mapping_at(const ModelConfig& config, int layer, ActivationSite site) {
  for (auto& m : smoothing_mappings(config))
    if (m.layer == layer && m.site == site) return std::move(m);
  throw std::invalid_argument(std::string("no smoothing mapping for ") + activation_site_name(site) + " of layer " + std::to_string(layer) +
                              " in architecture '" + config.architecture + "'");
}

int64_t mapping_channels(const Checkpoint& ck, const SmoothingMapping& m) {
  if (m.smooth.empty()) throw std::invalid_argument("smoothing mapping without smooth tensors");
  return tensor_at(ck, m.smooth.front()).dim(0);
}

std::vector<float> mapping_factors(const Checkpoint& ck, const SmoothingMapping& m, const LayerStats& stats, float alpha) {
  const std::vector<float>& act = stats.inputs.at(static_cast<size_t>(m.site)).absmax;
  std::vector<const Tensor*> ws;
  for (const auto& n : m.balance) ws.push_back(&tensor_at(ck, n + ".weight"));
  const std::vector<float> wmax = weight_column_absmax(ws);
  if (m.balance_channel.empty()) return smoothing_factors(act, wmax, alpha);  // UsageError when the widths differ
  if (m.balance_channel.size() != act.size() || act.size() != wmax.size())
    throw std::invalid_argument("smoothing " + describe_mapping(m) + ": balance_channel has " + std::to_string(m.balance_channel.size()) +
                                " entries, the statistics " + std::to_string(act.size()) + " channels, the balance linears " +
                                std::to_string(wmax.size()) + " input columns");
  // Several balance columns read one smooth channel (GQA): reduce both maxima over them.
  const size_t C = static_cast<size_t>(mapping_channels(ck, m));
  std::vector<float> act_c(C, 0.0f), w_c(C, 0.0f);
  for (size_t j = 0; j < act.size(); ++j) {
    const size_t g = static_cast<size_t>(m.balance_channel[j]);
    if (g >= C) throw std::invalid_argument("smoothing " + describe_mapping(m) + ": balance_channel out of range");
    act_c[g] = std::max(act_c[g], act[j]);
    w_c[g] = std::max(w_c[g], wmax[j]);
  }
  return smoothing_factors(act_c, w_c, alpha);
}

std::vector<float> balance_column_factors(const SmoothingMapping& m, const std::vector<float>& s) {
  if (m.balance_channel.empty()) return s;
  std::vector<float> out(m.balance_channel.size());
  for (size_t j = 0; j < out.size(); ++j) out[j] = s.at(static_cast<size_t>(m.balance_channel[j]));
  return out;
}

void apply_mapping(Checkpoint& ck, const SmoothingMapping& m, const std::vector<float>& s) {
  const int64_t C = static_cast<int64_t>(s.size());
  for (const auto& name : m.smooth) {
    Tensor& t = private_copy(ck, name);
    if (t.dim(0) != C)
      throw std::invalid_argument("apply_mapping: " + name + " has " + std::to_string(t.dim(0)) + " rows for " + std::to_string(C) + " factors");
    const int64_t row = t.numel() / C;
    float* d = t.mutable_data();
    for (int64_t r = 0; r < C; ++r)
      for (int64_t j = 0; j < row; ++j) d[r * row + j] /= s[size_t(r)];
  }
  const std::vector<float> col = balance_column_factors(m, s);
  for (const auto& base : m.balance) {
    Tensor& w = private_copy(ck, base + ".weight");
    const int64_t out = w.dim(0), in = w.dim(1);
    if (in != static_cast<int64_t>(col.size()))
      throw std::invalid_argument("apply_mapping: " + base + ".weight has " + std::to_string(in) + " input columns for " +
                                  std::to_string(col.size()) + " factors");
    float* d = w.mutable_data();
    for (int64_t r = 0; r < out; ++r)
      for (int64_t j = 0; j < in; ++j) d[r * in + j] *= col[size_t(j)];
  }
}

std::vector<SmoothingGroup> smooth_layer(Checkpoint& ck, int layer, const LayerStats& stats, const SmoothingOptions& o) {
  const std::vector<SmoothingMapping> maps = layer_smoothing_mappings(ck.config, layer, o.select);
  // Factors come from the weights before this layer is smoothed. (The balance sets of a layer's
  // mappings are disjoint, so this equals smoothing in order; it also keeps the α search of one
  // mapping independent of the others.)
  Checkpoint original;
  original.config = ck.config;
  original.source = ck.source;
  for (const auto& m : maps)
    for (const auto& b : m.balance) original.tensors[b + ".weight"] = tensor_at(ck, b + ".weight");
  if (o.alpha_objective || o.factors)  // the objective and the factor rule see every tensor of the layer as it was
    for (const auto& m : maps)
      for (const auto& t : m.smooth) original.tensors[t] = tensor_at(ck, t);
  const auto factors = [&](const SmoothingMapping& m, float a) {
    return o.factors ? o.factors(original, m, stats, a) : mapping_factors(original, m, stats, a);
  };
  std::vector<float> grid = o.alpha_grid;
  if (grid.empty())  // SmoothQuant's: 0.30, 0.35, ..., 0.95
    for (int k = 0; k <= 13; ++k) grid.push_back(0.30f + 0.05f * static_cast<float>(k));
  std::vector<SmoothingGroup> groups;
  for (const auto& m : maps) {
    float alpha = o.alpha;
    if (o.alpha_objective) {
      double best = -1;  // the first minimum wins
      for (const float a : grid) {
        const double e = o.alpha_objective(original, m, factors(m, a));
        if (best < 0 || e < best) {
          best = e;
          alpha = a;
        }
      }
    }
    std::vector<float> s = factors(m, alpha);
    apply_mapping(ck, m, s);
    groups.push_back({layer, m.site, alpha, std::move(s)});
  }
  return groups;
}

std::vector<SmoothingGroup> smooth_checkpoint(Checkpoint& ck, const std::vector<LayerStats>& stats, const SmoothingOptions& o) {
  if (stats.size() != static_cast<size_t>(ck.config.n_layers))
    throw std::invalid_argument("smooth_checkpoint: statistics for " + std::to_string(stats.size()) + " layers, the model has " +
                                std::to_string(ck.config.n_layers));
  std::vector<SmoothingGroup> all;
  for (int l = 0; l < ck.config.n_layers; ++l) {
    auto g = smooth_layer(ck, l, stats[size_t(l)], o);
    all.insert(all.end(), std::make_move_iterator(g.begin()), std::make_move_iterator(g.end()));
  }
  return all;
}

std::string describe_mapping(const SmoothingMapping& m) {
  const std::string p = names::layer(m.layer);
  auto local = [&](const std::string& n) { return n.rfind(p, 0) == 0 ? n.substr(p.size()) : n; };
  std::string s = std::string(activation_site_name(m.site)) + ": ";
  for (size_t i = 0; i < m.smooth.size(); ++i) s += (i ? ", " : "") + local(m.smooth[i]);
  s += " -> ";
  for (size_t i = 0; i < m.balance.size(); ++i) s += (i ? ", " : "") + local(m.balance[i]);
  if (!m.balance_channel.empty()) s += " (grouped)";
  return s;
}

}  // namespace sq
