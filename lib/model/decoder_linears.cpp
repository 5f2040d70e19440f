#include "model/decoder_linears.h"

#include <stdexcept>

#include "core/checkpoint.h"

namespace sq {

Projection LinearSlot::projection() const {
  switch (role) {
    case LinearRole::Q: return Projection::Q;
    case LinearRole::K: return Projection::K;
    case LinearRole::V: return Projection::V;
    case LinearRole::O: return Projection::O;
    case LinearRole::Gate:
    case LinearRole::ExpertGate: return Projection::Gate;
    case LinearRole::Up:
    case LinearRole::ExpertUp:
    case LinearRole::Router: return Projection::Up;
    case LinearRole::Down:
    case LinearRole::ExpertDown: return Projection::Down;
  }
  return Projection::Q;
}

std::vector<LinearSlot> decoder_layer_linears(const ModelConfig& c, int l) {
  const DecoderSpec& sp = c.spec;
  const int64_t d = c.dim, q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim, h = c.hidden_dim;
  const std::string p = names::layer(l);
  std::vector<LinearSlot> out;
  auto add = [&](LinearRole role, std::string name, int64_t o, int64_t i, bool bias, ActivationSite site, int expert = -1) {
    LinearSlot s;
    s.role = role;
    s.layer = l;
    s.expert = expert;
    s.name = std::move(name);
    s.out = o;
    s.in = i;
    s.bias = bias;
    s.site = site;
    s.quantize = role != LinearRole::Router;
    out.push_back(std::move(s));
  };
  const std::string a = p + "self_attn.";
  add(LinearRole::Q, a + "q_proj", q, d, c.qkv_bias, ActivationSite::AttnInput);
  add(LinearRole::K, a + "k_proj", kv, d, c.qkv_bias, ActivationSite::AttnInput);
  add(LinearRole::V, a + "v_proj", kv, d, c.qkv_bias, ActivationSite::AttnInput);
  add(LinearRole::O, a + "o_proj", d, q, sp.o_bias, ActivationSite::AttnOutput);
  if (sp.n_experts > 0) {
    add(LinearRole::Router, p + "mlp.router", sp.n_experts, d, false, ActivationSite::FfnInput);
    for (int e = 0; e < sp.n_experts; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      add(LinearRole::ExpertGate, x + "gate_proj", h, d, false, ActivationSite::FfnInput, e);
      add(LinearRole::ExpertUp, x + "up_proj", h, d, false, ActivationSite::FfnInput, e);
      add(LinearRole::ExpertDown, x + "down_proj", d, h, false, ActivationSite::FfnHidden, e);
    }
  } else {
    if (sp.mlp_gated) add(LinearRole::Gate, p + "mlp.gate_proj", h, d, sp.mlp_bias, ActivationSite::FfnInput);
    add(LinearRole::Up, p + "mlp.up_proj", h, d, sp.mlp_bias, ActivationSite::FfnInput);
    add(LinearRole::Down, p + "mlp.down_proj", d, h, sp.mlp_bias, ActivationSite::FfnHidden);
  }
  return out;
}

std::unique_ptr<Linear>& linear_slot(DecoderLayer& L, const LinearSlot& s) {
  auto expert = [&]() -> Expert& {
    if (s.expert < 0) throw std::invalid_argument("linear_slot: expert role without an expert index (" + s.name + ")");
    if (L.experts.size() <= static_cast<size_t>(s.expert)) L.experts.resize(static_cast<size_t>(s.expert) + 1);
    return L.experts[static_cast<size_t>(s.expert)];
  };
  switch (s.role) {
    case LinearRole::Q: return L.q_proj;
    case LinearRole::K: return L.k_proj;
    case LinearRole::V: return L.v_proj;
    case LinearRole::O: return L.o_proj;
    case LinearRole::Gate: return L.gate_proj;
    case LinearRole::Up: return L.up_proj;
    case LinearRole::Down: return L.down_proj;
    case LinearRole::Router: return L.router;
    case LinearRole::ExpertGate: return expert().gate_proj;
    case LinearRole::ExpertUp: return expert().up_proj;
    case LinearRole::ExpertDown: return expert().down_proj;
  }
  throw std::logic_error("linear_slot: unknown role");
}

const Linear* linear_of(const DecoderLayer& L, const LinearSlot& s) {
  if (s.expert >= 0 && L.experts.size() <= static_cast<size_t>(s.expert)) return nullptr;
  return linear_slot(const_cast<DecoderLayer&>(L), s).get();
}

void set_layer_prepack(const ModelConfig& c, int l, DecoderLayer& L, bool on) {
  for (const LinearSlot& s : decoder_layer_linears(c, l))
    if (linear_of(L, s))  // set (an expert slot beyond L.experts is not)
      if (auto* d = dynamic_cast<DenseLinear*>(linear_slot(L, s).get())) d->set_prepack(on);
}

void set_model_prepack(Decoder& model, bool on) {
  for (int l = 0; l < int(model.layers().size()); ++l) set_layer_prepack(model.config(), l, model.mutable_layers()[size_t(l)], on);
  std::unique_ptr<Linear> head = model.release_lm_head();
  if (auto* d = dynamic_cast<DenseLinear*>(head.get())) d->set_prepack(on);
  model.set_lm_head(std::move(head));
}

int64_t dense_linear_bytes(const Decoder& model) {
  int64_t bytes = 0;
  auto add = [&](const Linear* lin) {
    if (const auto* d = dynamic_cast<const DenseLinear*>(lin)) bytes += 4 * d->weight().numel();
  };
  for (int l = 0; l < int(model.layers().size()); ++l)
    for (const LinearSlot& s : decoder_layer_linears(model.config(), l)) add(linear_of(model.layers()[size_t(l)], s));
  if (model.has_lm_head()) add(&model.lm_head());
  return bytes;
}

std::vector<LayerTensorSlot> decoder_layer_tensors(const ModelConfig& c, int l) {
  const DecoderSpec& sp = c.spec;
  const int64_t d = c.dim, hd = c.head_dim;
  const std::string p = names::layer(l);
  std::vector<LayerTensorSlot> t;
  // LLaMA's two norms first, in the order sq-convert has always written them.
  t.push_back({p + "input_layernorm.weight", d, &DecoderLayer::attn_norm});
  if (!sp.shared_input_norm) t.push_back({p + "post_attention_layernorm.weight", d, &DecoderLayer::ffn_norm});
  if (sp.norm_bias) {
    t.push_back({p + "input_layernorm.bias", d, &DecoderLayer::attn_norm_bias});
    if (!sp.shared_input_norm) t.push_back({p + "post_attention_layernorm.bias", d, &DecoderLayer::ffn_norm_bias});
  }
  if (sp.qk_norm) {
    t.push_back({p + "self_attn.q_norm.weight", hd, &DecoderLayer::q_norm});
    t.push_back({p + "self_attn.k_norm.weight", hd, &DecoderLayer::k_norm});
  }
  if (sp.post_attn_norm) {
    t.push_back({p + "attn_post_norm.weight", d, &DecoderLayer::attn_post_norm});
    if (sp.norm_bias) t.push_back({p + "attn_post_norm.bias", d, &DecoderLayer::attn_post_norm_bias});
  }
  if (sp.post_ffn_norm) {
    t.push_back({p + "mlp_post_norm.weight", d, &DecoderLayer::ffn_post_norm});
    if (sp.norm_bias) t.push_back({p + "mlp_post_norm.bias", d, &DecoderLayer::ffn_post_norm_bias});
  }
  return t;
}

std::vector<GlobalTensorSlot> decoder_global_tensors(const ModelConfig& c) {
  const DecoderSpec& sp = c.spec;
  const int64_t d = c.dim;
  std::vector<GlobalTensorSlot> g;
  if (sp.embed_norm) {
    g.push_back({names::kEmbedNorm, {d}, &DecoderGlobals::embed_norm});
    if (sp.norm_bias) g.push_back({names::kEmbedNormBias, {d}, &DecoderGlobals::embed_norm_bias});
  }
  if (sp.position == PositionKind::Learned)
    g.push_back({names::kEmbedPositions, {int64_t(c.max_seq_len) + sp.learned_position_offset, d}, &DecoderGlobals::embed_positions});
  if (sp.norm_bias) g.push_back({names::kFinalNormBias, {d}, &DecoderGlobals::final_norm_bias});
  return g;
}

DecoderLayer build_decoder_layer(const ModelConfig& c, int l, const WeightSource& src) {
  DecoderLayer L;
  for (const LayerTensorSlot& t : decoder_layer_tensors(c, l)) L.*t.field = src.tensor(t.name, {t.size});
  for (const LinearSlot& s : decoder_layer_linears(c, l)) linear_slot(L, s) = src.linear(s);
  return L;
}

DecoderGlobals build_decoder_globals(const ModelConfig& c, const WeightSource& src) {
  DecoderGlobals g;
  for (const GlobalTensorSlot& t : decoder_global_tensors(c)) g.*t.field = src.tensor(t.name, t.shape);
  return g;
}

DecoderLayer copy_layer_tensors(const ModelConfig& c, int l, const DecoderLayer& L) {
  DecoderLayer q;
  for (const LayerTensorSlot& t : decoder_layer_tensors(c, l)) q.*t.field = L.*t.field;
  return q;
}

}  // namespace sq
