#include "calib/recipe_smoothing.h"

#include <algorithm>

#include "calib/smoothquant.h"
#include "core/error.h"
#include "model/w8a8_linear.h"

namespace sq {

constexpr ActivationSite kSmoothedSites[] = {ActivationSite::AttnInput, ActivationSite::FfnInput, ActivationSite::AttnOutput};

/// Captures up to `max_rows` rows of each smoothable linear input of every layer (--alpha auto).
class ActivationCapture final : public ActivationObserver {
 public:
  ActivationCapture(int n_layers, int64_t stride) : stride_(stride), rows_(size_t(n_layers) * kActivationSites) {}
  void on_linear_input(int layer, ActivationSite site, const float* x, int64_t n, int64_t width) override {
    auto& r = rows_[size_t(layer) * kActivationSites + size_t(site)];
    for (int64_t t = 0; t < n; t += stride_) r.data.insert(r.data.end(), x + t * width, x + (t + 1) * width);
    r.width = width;
  }
  const SiteRows& get(int layer, ActivationSite site) const { return rows_[size_t(layer) * kActivationSites + size_t(site)]; }

 private:
  int64_t stride_;
  std::vector<SiteRows> rows_;
};

namespace {

/// Per-input-channel expansion of smoothing factors (AttnOutput factors are per KV channel).
std::vector<float> expand_factors(const ModelConfig& c, ActivationSite site, const std::vector<float>& s) {
  const std::vector<float> ones(site == ActivationSite::AttnOutput ? size_t(c.n_heads) * c.head_dim : s.size(), 1.0f);
  const std::vector<float> inv = smoothed_absmax(c, site, ones, s);  // 1/s per input channel
  std::vector<float> out(inv.size());
  for (size_t j = 0; j < inv.size(); ++j) out[j] = 1.0f / inv[j];
  return out;
}

/// Output MSE of the site's linears, FP32 vs W8A8 (real INT8 path), after smoothing with `s`.
double group_mse(const Checkpoint& layer_ck, int layer, ActivationSite site, const std::vector<float>* s, const SiteRows& X,
                 const LayerStats& st, const ConvertOptions& o) {
  Checkpoint ck = layer_ck;
  std::vector<float> xs = X.data;
  if (s) {
    apply_smoothing(ck, layer, site, *s);
    const auto e = expand_factors(ck.config, site, *s);
    for (int64_t r = 0; r < X.count(); ++r)
      for (int64_t j = 0; j < X.width; ++j) xs[size_t(r * X.width + j)] /= e[size_t(j)];
  }
  const float step = o.act == ActQuant::PerTensorStatic ? smoothed_static_step(ck.config, st, site, s) : 0.0f;
  double mse = 0;
  for (const auto& name : smoothing_linears(layer, site)) {
    const Tensor& w_orig = layer_ck.tensors.at(name + ".weight");
    const int64_t out = w_orig.dim(0), n = X.count();
    std::vector<float> ref(size_t(n * out)), got(size_t(n * out));
    DenseLinear(w_orig).forward(X.data.data(), n, ref.data());
    W8A8Linear(ck.tensors.at(name + ".weight"), o.weight, o.act, step).forward(xs.data(), n, got.data());
    for (size_t i = 0; i < ref.size(); ++i) mse += double(ref[i] - got[i]) * (ref[i] - got[i]);
  }
  return mse;
}

}  // namespace

/// Static activation step of a site: Δ = (smoothed) calibrated absmax / 127.
float smoothed_static_step(const ModelConfig& c, const LayerStats& st, ActivationSite site, const std::vector<float>* factors) {
  const ChannelStats& cs = st.inputs[size_t(site)];
  float m = cs.tensor_absmax;
  if (factors) {
    const auto sm = smoothed_absmax(c, site, cs.absmax, *factors);
    m = *std::max_element(sm.begin(), sm.end());
  }
  return int8_step(m);
}

bool llama_smoothing_applies(const ModelConfig& c) {
  const DecoderSpec& sp = c.spec;
  return !sp.norm_bias && !sp.parallel_residual && sp.mlp_gated && sp.n_experts == 0;
}

SmoothingStep::SmoothingStep(ConvertInputs& in, bool enabled) : enabled_(enabled) {
  if (!enabled_) return;
  const ModelConfig& c = in.config;
  const ConvertOptions& o = in.o;
  if (!llama_smoothing_applies(c))
    throw UnsupportedError(in.src.path + ": SmoothQuant smoothing of architecture '" + c.architecture +
                           "' needs its smoothing mappings (norm biases, parallel residual, plain MLP or experts), which this "
                           "build lacks; convert with --no-smooth");
  if (!o.alpha_auto) return;
  // --alpha auto: activations of the FP32 model on calibration windows (smoothing earlier layers
  // does not change the function, so these are also the inputs of the smoothed model).
  if (!in.can_redraw) throw UsageError("--alpha auto needs the tokenizer (give --tokenizer)");
  const std::string path = in.calibration_text("--alpha auto", "");
  const auto windows = in.redraw_windows(path, o.alpha_windows);
  const int64_t total_rows = o.alpha_windows * in.calib.provenance.seq_len;
  const int64_t stride = std::max<int64_t>(1, (total_rows + o.alpha_max_rows - 1) / o.alpha_max_rows);
  capture_ = std::make_unique<ActivationCapture>(c.n_layers, stride);
  for (const auto& w : windows) {
    KVCache cache(c, static_cast<int64_t>(w.size()));
    Workspace ws;
    in.src.model->forward(w.data(), static_cast<int64_t>(w.size()), cache, ws, nullptr, LogitsFor::None, capture_.get());
  }
}

SmoothingStep::~SmoothingStep() = default;

void SmoothingStep::apply(const ConvertInputs& in, LayerWork& w, ConvertSummary& summary) const {
  if (!enabled_) return;
  const int l = w.layer;
  const LayerStats& st = in.calib.layers[size_t(l)];
  const Checkpoint original = w.tensors;
  for (ActivationSite site : kSmoothedSites) {
    if (site == ActivationSite::AttnOutput && !in.o.smooth_vo) continue;
    float alpha = in.o.alpha;
    if (capture_) {
      double best = -1;  // grid 0.30, 0.35, ..., 0.95; the first minimum wins
      for (int k = 0; k <= 13; ++k) {
        const float a = 0.30f + 0.05f * static_cast<float>(k);
        const auto s = compute_group_factors(original, st, l, site, a);
        const double e = group_mse(original, l, site, &s, capture_->get(l, site), st, in.o);
        if (best < 0 || e < best) {
          best = e;
          alpha = a;
        }
      }
    }
    const auto s = compute_group_factors(original, st, l, site, alpha);
    apply_smoothing(w.tensors, l, site, s);
    w.smoothing[site] = s;
    summary.groups.push_back({l, site, alpha, s});
  }
}

}  // namespace sq
