#include "calib/recipe_smoothing.h"

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>

#include "calib/awq.h"
#include "calib/int4_layer_quantizer.h"
#include "calib/smoothing_mappings.h"
#include "calib/smoothquant.h"
#include "core/error.h"
#include "model/w4a16_linear.h"
#include "model/w8a8_linear.h"

namespace sq {

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

const LinearSlot& slot_named(const std::vector<LinearSlot>& linears, const std::string& name) {
  for (const LinearSlot& s : linears)
    if (s.name == name) return s;
  throw std::logic_error("smoothing: balance linear " + name + " is not a linear of its layer");
}

/// The quantized form of balance linear `slot` whose scaled weight is `W` (its input columns × the
/// factors `e`), for output_mse.
using QuantizedBalance = std::function<std::unique_ptr<Linear>(const LinearSlot& slot, const Tensor& W, const std::vector<float>& e)>;

/// The α searches' objective: summed squared error between the FP32 outputs and the quantized
/// outputs (the runner's real path) of mapping `m`'s quantized balance linears after scaling by
/// `s`, on rows X of their input (the FP32 model's activations at m.site; with a shared input norm
/// the FFN inputs read the same rows). Linears kept in FP32 (the MoE router) are skipped: scaling
/// them is exact.
double output_mse(const Checkpoint& original, const std::vector<LinearSlot>& linears, const SmoothingMapping& m, const std::vector<float>& s,
                  const SiteRows& X, const QuantizedBalance& quantized) {
  Checkpoint ck = original;  // shares storage: apply_mapping replaces what it touches by clones
  apply_mapping(ck, m, s);
  const std::vector<float> e = balance_column_factors(m, s);  // per input channel
  std::vector<float> xs = X.data;
  for (int64_t r = 0; r < X.count(); ++r)
    for (int64_t j = 0; j < X.width; ++j) xs[size_t(r * X.width + j)] /= e[size_t(j)];
  double mse = 0;
  for (const auto& name : m.balance) {
    const LinearSlot& slot = slot_named(linears, name);
    if (!slot.quantize) continue;
    const Tensor& w_orig = original.tensors.at(name + ".weight");
    const int64_t out = w_orig.dim(0), n = X.count();
    std::vector<float> ref(size_t(n * out)), got(size_t(n * out));
    DenseLinear dense(w_orig);
    dense.set_prepack(false);  // one product: a packed copy of the weight would cost more than it saves
    dense.forward(X.data.data(), n, ref.data());
    quantized(slot, ck.tensors.at(name + ".weight"), e)->forward(xs.data(), n, got.data());
    for (size_t i = 0; i < ref.size(); ++i) mse += double(ref[i] - got[i]) * (ref[i] - got[i]);
  }
  return mse;
}

/// --alpha auto's quantized linears: W8A8 with the file's weight and activation modes (a static
/// step from the smoothed statistics for O3).
QuantizedBalance w8a8_balance(const LayerStats& st, const ConvertOptions& o) {
  return [&st, &o](const LinearSlot& slot, const Tensor& W, const std::vector<float>& e) -> std::unique_ptr<Linear> {
    const float step = o.act == ActQuant::PerTensorStatic ? smoothed_static_step(st, slot.site, &e) : 0.0f;
    return std::make_unique<W8A8Linear>(W, o.weight, o.act, step);
  };
}

/// --awq's quantized linears (AWQ Eq. 5): W4A16 in the file's group size and symmetry by min/max
/// round-to-nearest, as AWQ's search does (its pseudo_quantize_tensor); the conversion then
/// quantizes the chosen scaling with the file's own method (the scale search, GPTQ). Searching with
/// the scale search inside cost 20× a conversion (SmolLM2 g32: 10 min) and was not better
/// everywhere (docs/quantization.md, "AWQ scaling"). For Q4_K files (--k-quant) the search's
/// proxy is the flat g32 asymmetric layout by min/max (Q4_K's groups and minimum, without the
/// two-level scale search, which made each candidate cost as much as a conversion).
QuantizedBalance awq_balance(const ConvertOptions& o) {
  Int4Options ro = o.int4;
  ro.gptq = false;
  ro.act_order = false;
  ro.scale_search = false;
  ro.k_quant = false;
  return [ro](const LinearSlot& slot, const Tensor& W, const std::vector<float>&) -> std::unique_ptr<Linear> {
    return std::make_unique<W4A16Linear>(quantize_linear_int4(W, slot.name, ro, nullptr).weights, Tensor());
  };
}

}  // namespace

float smoothed_static_step(const LayerStats& st, ActivationSite site, const std::vector<float>* factors) {
  const ChannelStats& cs = st.inputs[size_t(site)];
  float m = cs.tensor_absmax;
  if (factors) {
    if (factors->size() != cs.absmax.size())
      throw std::logic_error(std::string("smoothing: ") + std::to_string(factors->size()) + " factors for the " +
                             std::to_string(cs.absmax.size()) + " channels of " + activation_site_name(site));
    m = 0.0f;
    for (size_t j = 0; j < cs.absmax.size(); ++j) m = std::max(m, cs.absmax[j] / (*factors)[j]);
  }
  return int8_step(m);
}

SmoothingStep::SmoothingStep(ConvertInputs& in, bool enabled) : enabled_(enabled) {
  if (!enabled_) return;
  const ModelConfig& c = in.config;
  const ConvertOptions& o = in.o;
  if (!o.alpha_auto && !o.awq) return;
  // --alpha auto / --awq: activations of the FP32 model on calibration windows (smoothing earlier
  // layers does not change the function, so these are also the inputs of the smoothed model).
  const char* what = o.awq ? "--awq" : "--alpha auto";
  if (!in.can_redraw) throw UsageError(std::string(what) + " needs the tokenizer (give --tokenizer)");
  const std::string path = in.calibration_text(what, "");
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
  SmoothingOptions so;
  so.alpha = in.o.alpha;
  so.select.attn_output = in.o.smooth_vo;
  if (in.o.awq) {  // AWQ: every exact mapping (AWQ scales v → o and up → down too), its factors and grid
    so.select.attn_output = true;
    so.select.ffn_hidden = true;
    so.factors = awq_mapping_factors;
    so.alpha_grid = awq_alpha_grid();
    so.alpha_objective = [&](const Checkpoint& original, const SmoothingMapping& m, const std::vector<float>& s) {
      return output_mse(original, w.linears, m, s, capture_->get(l, m.site), awq_balance(in.o));
    };
  } else if (capture_) {  // --alpha auto: α per mapping minimizing the W8A8 output MSE on the captured rows
    so.alpha_objective = [&](const Checkpoint& original, const SmoothingMapping& m, const std::vector<float>& s) {
      return output_mse(original, w.linears, m, s, capture_->get(l, m.site), w8a8_balance(st, in.o));
    };
  }
  const std::vector<SmoothingMapping> maps = layer_smoothing_mappings(in.config, l, so.select);
  std::vector<SmoothingGroup> groups = smooth_layer(w.tensors, l, st, so);
  if (groups.size() != maps.size()) throw std::logic_error("smoothing: smooth_layer returned a group per mapping");
  for (size_t i = 0; i < maps.size(); ++i) {
    // The activations of every site a balance linear reads are divided by the mapping's factors
    // (per input column: v → o's per-KV-channel factors expanded to o_proj's columns; a shared
    // input norm's factors also divide the FFN input).
    const std::vector<float> cols = balance_column_factors(maps[i], groups[i].factors);
    for (const auto& name : maps[i].balance) {
      const ActivationSite site = slot_named(w.linears, name).site;
      auto [it, inserted] = w.smoothing.emplace(site, cols);
      if (!inserted && it->second != cols)
        throw std::logic_error(std::string("smoothing: two mappings of layer ") + std::to_string(l) + " divide " +
                               activation_site_name(site) + " by different factors");
    }
    summary.groups.push_back(std::move(groups[i]));
  }
}

}  // namespace sq
