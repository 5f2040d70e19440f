#include "calib/smoothquant.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/error.h"

namespace sq {

namespace {
constexpr float kMinMax = 1e-5f;

/// Query-head channel (h, i) → KV channel (h / group, i), for the attention output width.
int64_t kv_channel(const ModelConfig& c, int64_t q_channel) {
  const int64_t h = q_channel / c.head_dim, i = q_channel % c.head_dim;
  return (h / (c.n_heads / c.n_kv_heads)) * c.head_dim + i;
}

Tensor& owned(Checkpoint& ck, const std::string& name) {
  Tensor& t = ck.tensors.at(name);
  if (!t.owned()) t = t.clone();
  return t;
}
}  // namespace

std::vector<float> smoothing_factors(const std::vector<float>& act, const std::vector<float>& w, float alpha) {
  if (!(alpha >= 0.0f && alpha <= 1.0f)) throw UsageError("migration strength alpha must be in [0, 1], got " + std::to_string(alpha));
  if (act.size() != w.size())
    throw UsageError("smoothing: activation statistics have " + std::to_string(act.size()) + " channels but the weights " +
                     std::to_string(w.size()));
  std::vector<float> s(act.size());
  for (size_t j = 0; j < act.size(); ++j) {
    const double a = std::max(act[j], kMinMax), b = std::max(w[j], kMinMax);
    const double v = std::pow(a, alpha) / std::pow(b, 1.0 - alpha);
    s[j] = static_cast<float>(std::clamp(v, 1e-5, 1e5));
  }
  return s;
}

std::vector<float> weight_column_absmax(const std::vector<const Tensor*>& weights) {
  const int64_t in = weights.at(0)->dim(1);
  std::vector<float> m(static_cast<size_t>(in), 0.0f);
  for (const Tensor* w : weights) {
    if (w->dim(1) != in) throw std::invalid_argument("weight_column_absmax: input widths differ");
    const float* p = w->data();
    for (int64_t r = 0; r < w->dim(0); ++r)
      for (int64_t j = 0; j < in; ++j) m[static_cast<size_t>(j)] = std::max(m[static_cast<size_t>(j)], std::fabs(p[r * in + j]));
  }
  return m;
}

std::vector<std::string> smoothing_linears(int layer, ActivationSite site) {
  const std::string p = names::layer(layer);
  switch (site) {
    case ActivationSite::AttnInput: return {p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"};
    case ActivationSite::AttnOutput: return {p + "self_attn.o_proj"};
    case ActivationSite::FfnInput: return {p + "mlp.gate_proj", p + "mlp.up_proj"};
    case ActivationSite::FfnHidden: return {p + "mlp.down_proj"};
  }
  return {};
}

std::vector<float> compute_group_factors(const Checkpoint& ck, const LayerStats& stats, int layer, ActivationSite site, float alpha) {
  const std::vector<float>& act = stats.inputs.at(static_cast<size_t>(site)).absmax;
  std::vector<const Tensor*> ws;
  for (const auto& n : smoothing_linears(layer, site)) ws.push_back(&ck.tensors.at(n + ".weight"));
  std::vector<float> wmax = weight_column_absmax(ws);
  if (site != ActivationSite::AttnOutput) return smoothing_factors(act, wmax, alpha);
  // Grouped-query attention: reduce both maxima over the query heads sharing a KV channel.
  const ModelConfig& c = ck.config;
  const size_t kv = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
  std::vector<float> act_kv(kv, 0.0f), w_kv(kv, 0.0f);
  for (size_t j = 0; j < act.size(); ++j) {
    const size_t g = static_cast<size_t>(kv_channel(c, static_cast<int64_t>(j)));
    act_kv[g] = std::max(act_kv[g], act[j]);
    w_kv[g] = std::max(w_kv[g], wmax[j]);
  }
  return smoothing_factors(act_kv, w_kv, alpha);
}

void apply_smoothing(Checkpoint& ck, int layer, ActivationSite site, const std::vector<float>& s) {
  const ModelConfig& c = ck.config;
  const std::string p = names::layer(layer);
  auto scale_columns = [&](const std::string& name, auto column_factor) {
    Tensor& w = owned(ck, name);
    float* d = w.mutable_data();
    const int64_t out = w.dim(0), in = w.dim(1);
    for (int64_t r = 0; r < out; ++r)
      for (int64_t j = 0; j < in; ++j) d[r * in + j] *= column_factor(j);
  };
  if (site == ActivationSite::AttnInput || site == ActivationSite::FfnInput) {
    const std::string norm = p + (site == ActivationSite::AttnInput ? "input_layernorm.weight" : "post_attention_layernorm.weight");
    Tensor& g = owned(ck, norm);
    if (g.numel() != static_cast<int64_t>(s.size())) throw std::invalid_argument("apply_smoothing: factor count mismatch for " + norm);
    for (size_t j = 0; j < s.size(); ++j) g.mutable_data()[j] /= s[j];
    for (const auto& lin : smoothing_linears(layer, site)) scale_columns(lin + ".weight", [&](int64_t j) { return s[size_t(j)]; });
    return;
  }
  if (site == ActivationSite::AttnOutput) {
    // V rows (output channels of v_proj) ÷ s; o_proj columns × s of their KV channel.
    const int64_t kv = int64_t(c.n_kv_heads) * c.head_dim;
    if (static_cast<int64_t>(s.size()) != kv) throw std::invalid_argument("apply_smoothing: --smooth-vo needs one factor per KV channel");
    Tensor& v = owned(ck, p + "self_attn.v_proj.weight");
    const int64_t in = v.dim(1);
    for (int64_t r = 0; r < kv; ++r)
      for (int64_t j = 0; j < in; ++j) v.mutable_data()[r * in + j] /= s[size_t(r)];
    if (ck.has(p + "self_attn.v_proj.bias")) {
      Tensor& b = owned(ck, p + "self_attn.v_proj.bias");
      for (int64_t r = 0; r < kv; ++r) b.mutable_data()[r] /= s[size_t(r)];
    }
    scale_columns(p + "self_attn.o_proj.weight", [&](int64_t j) { return s[size_t(kv_channel(c, j))]; });
    return;
  }
  throw std::invalid_argument("apply_smoothing: the down_proj input (ffn_hidden) is not smoothed");
}

std::vector<float> smoothed_absmax(const ModelConfig& c, ActivationSite site, const std::vector<float>& absmax,
                                   const std::vector<float>& s) {
  std::vector<float> out(absmax.size());
  for (size_t j = 0; j < absmax.size(); ++j) {
    const size_t k = site == ActivationSite::AttnOutput ? static_cast<size_t>(kv_channel(c, static_cast<int64_t>(j))) : j;
    out[j] = absmax[j] / s[k];
  }
  return out;
}

}  // namespace sq
