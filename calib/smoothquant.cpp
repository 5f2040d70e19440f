#include "calib/smoothquant.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "calib/smoothing_mappings.h"
#include "core/error.h"

namespace sq {

namespace {
constexpr float kMinMax = 1e-5f;

/// Query-head channel (h, i) → KV channel (h / group, i), for the attention output width.
int64_t kv_channel(const ModelConfig& c, int64_t q_channel) {
  const int64_t h = q_channel / c.head_dim, i = q_channel % c.head_dim;
  return (h / (c.n_heads / c.n_kv_heads)) * c.head_dim + i;
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
  return mapping_factors(ck, smoothing_mapping_at(ck.config, layer, site), stats, alpha);
}

void apply_smoothing(Checkpoint& ck, int layer, ActivationSite site, const std::vector<float>& s) {
  apply_mapping(ck, smoothing_mapping_at(ck.config, layer, site), s);
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
