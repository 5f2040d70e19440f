#include "calib/atom_layer_quantizer.h"

#include <algorithm>
#include <cmath>

#include "calib/channel_reorder.h"
#include "calib/gptq.h"
#include "model/decoder_linears.h"
#include "core/error.h"
#include "formats/safetensors.h"
#include "quant/int8_quantize.h"

namespace sq {

void validate_atom_options(const AtomOptions& o) {
  if (o.group_size != 0 && o.group_size != 32 && o.group_size != 64 && o.group_size != 128)
    throw UsageError("--group-size must be 0 (per channel / per token), 32, 64 or 128 for --scheme w4a4-atom, got " +
                     std::to_string(o.group_size));
  if (o.clip != "none" && o.clip != "default" && o.clip != "search")
    throw UsageError("--clip must be none, default or search, got '" + o.clip + "'");
  if (!(o.weight_clip > 0.0f && o.weight_clip <= 1.0f))
    throw UsageError("--weight-clip must be in (0, 1], got " + std::to_string(o.weight_clip));
  if (!(o.act_clip > 0.0f && o.act_clip <= 1.0f)) throw UsageError("--act-clip must be in (0, 1], got " + std::to_string(o.act_clip));
  if (o.outlier_channels < -1) throw UsageError("--outlier-channels must be ≥ 0 or auto, got " + std::to_string(o.outlier_channels));
  if (!(o.damp >= 0.0 && o.damp < 1e6)) throw UsageError("--damp must be a finite value ≥ 0, got " + std::to_string(o.damp));
}

namespace {

/// Quantizes a reordered weight Wr [out, in] (outliers = the last n columns) into W4A4LinearData.
W4A4LinearData quantize_linear(const Tensor& Wr, int64_t n, const AtomOptions& o, float weight_clip, float act_clip,
                               const std::vector<double>* H, const std::string& name, double* hessian_error) {
  const int64_t out = Wr.dim(0), in = Wr.dim(1), inn = in - n;
  GptqOptions g;
  g.bits = 4;
  g.group_size = o.group_size;
  g.symmetric = true;
  g.damp = o.damp;
  g.act_order = o.act_order;
  g.static_groups = true;
  g.fp16_scales = true;
  g.clip = weight_clip;
  g.tail_columns = n;
  g.name = name;
  GptqResult r;
  if (o.gptq) {
    if (!H) throw InputError(name + ": GPTQ needs the input Hessian of this layer (calibrate with --hessian)");
    r = gptq_quantize(Wr.data(), out, in, *H, g);
  } else {
    r = rtn_quantize(Wr.data(), out, in, g);
    if (H) r.hessian_error = hessian_weighted_error(Wr.data(), r.dequantized.data(), out, in, *H);
  }
  if (hessian_error) *hessian_error = r.hessian_error;
  W4A4LinearData d;
  d.out = out;
  d.in = in;
  d.n_outlier = n;
  d.group = o.group_size;
  d.act_clip = act_clip;
  d.outlier_format = o.outlier_format;
  const int64_t G = w4a4_stored_groups(inn, o.group_size);
  if (G != r.n_groups) throw std::logic_error("quantize_linear: group count mismatch");
  d.codes.resize(static_cast<size_t>(out * inn));
  d.scales_f16.resize(static_cast<size_t>(out * G));
  for (int64_t row = 0; row < out; ++row) {
    for (int64_t c = 0; c < inn; ++c) d.codes[size_t(row * inn + c)] = static_cast<int8_t>(int(r.codes[size_t(row * in + c)]) - 8);
    for (int64_t j = 0; j < G; ++j) d.scales_f16[size_t(row * G + j)] = float_to_half(r.scales[size_t(row * G + j)]);
  }
  // Outlier columns: their GPTQ-updated (or, for RTN, original) FP32 values, INT8 per row or FP32.
  if (o.outlier_format == W4A4OutlierFormat::Int8) {
    d.outlier_codes.resize(static_cast<size_t>(out * n));
    d.outlier_scales.assign(static_cast<size_t>(out), 1.0f);
    for (int64_t row = 0; row < out; ++row) {
      if (n == 0) continue;
      const float* t = r.dequantized.data() + row * in + inn;
      const float step = int8_step(abs_max(t, n));
      d.outlier_scales[size_t(row)] = step;
      quantize_int8(t, n, step, d.outlier_codes.data() + row * n);
    }
  } else {
    d.outlier_weights.resize(static_cast<size_t>(out * n));
    for (int64_t row = 0; row < out; ++row)
      std::copy_n(r.dequantized.data() + row * in + inn, n, d.outlier_weights.data() + row * n);
  }
  return d;
}

/// X·Wrᵀ for calibration rows X [rows, in] (in the producer's order when `order` is set: Wr is
/// then the reordered weight and the product is taken on the reordered rows).
std::vector<float> reference_output(const Tensor& Wr, const SiteRows& X, const std::vector<int32_t>& order) {
  const int64_t m = X.count(), in = Wr.dim(1);
  std::vector<float> xr(X.data);
  if (!order.empty())
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < in; ++p) xr[size_t(i * in + p)] = X.data[size_t(i * in + order[size_t(p)])];
  std::vector<float> ref(static_cast<size_t>(m * Wr.dim(0)));
  DenseLinear dense(Wr);
  dense.set_prepack(false);  // one product: a packed copy of Wr would cost more than it saves
  dense.forward(xr.data(), m, ref.data());
  return ref;
}

/// Σ (ref − W4A4(X))² with the real W4A4 layer built from `d`.
double output_error(const W4A4LinearData& d, const SiteRows& X, const std::vector<float>& ref) {
  std::vector<float> got(ref.size());
  W4A4Linear(d).forward(X.data.data(), X.count(), got.data());
  double e = 0;
  for (size_t i = 0; i < ref.size(); ++i) e += double(ref[i] - got[i]) * double(ref[i] - got[i]);
  return e;
}

}  // namespace

AtomLayer quantize_layer_atom(const Checkpoint& ck, int layer, const AtomOptions& o, const LayerStats* stats,
                              const std::array<const std::vector<double>*, kActivationSites>& hessians,
                              const std::array<const SiteRows*, kActivationSites>& rows) {
  validate_atom_options(o);
  const ModelConfig& c = ck.config;
  const int64_t widths[kActivationSites] = {c.dim, int64_t(c.n_heads) * c.head_dim, c.dim, c.hidden_dim};
  AtomLayer res;
  for (int s = 0; s < kActivationSites; ++s) {
    const ActivationSite site = static_cast<ActivationSite>(s);
    const int64_t n = atom_outlier_count(widths[s], o.outlier_channels);
    res.n_outlier[size_t(s)] = n;
    if (n == 0) continue;
    if (!stats || stats->inputs.size() != size_t(kActivationSites) ||
        static_cast<int64_t>(stats->inputs[size_t(s)].sum_sq.size()) != widths[s])
      throw InputError(std::string("layer ") + std::to_string(layer) + " " + activation_site_name(site) +
                       ": outlier selection needs the calibration sum of squares of width " + std::to_string(widths[s]) +
                       " (give --calib)");
    res.orders[size_t(s)] = outlier_channel_order(stats->inputs[size_t(s)].sum_sq, n);
  }
  Checkpoint lk;  // this layer's tensors, with the ffn_hidden reorder folded into gate/up rows and down columns
  lk.config = c;
  lk.source = ck.source;
  const std::string p = names::layer(layer);
  for (const auto& [name, t] : ck.tensors)
    if (name.rfind(p, 0) == 0) lk.tensors[name] = t;
  const auto& hidden_order = res.orders[size_t(ActivationSite::FfnHidden)];
  if (!hidden_order.empty()) fold_ffn_hidden_order(lk, layer, hidden_order);

  for (const LinearSlot& slot : decoder_layer_linears(c, layer)) {
    if (!slot.quantize) continue;  // the MoE router stays FP32
    const ActivationSite site = slot.site;
    const size_t s = static_cast<size_t>(site);
    const std::string& name = slot.name;
    const auto& order = res.orders[s];
    const bool gathered = site != ActivationSite::FfnHidden && !order.empty();
    const Tensor& W = lk.tensors.at(name + ".weight");
    const int64_t in = W.dim(1), n = res.n_outlier[s];
    const Tensor Wr = gathered ? permute_columns(W, order) : W;  // down_proj: columns already permuted by the fold
    std::vector<double> Hr;
    const std::vector<double>* H = hessians[s];
    if (H) {
      if (static_cast<int64_t>(H->size()) != in * in)
        throw InputError(name + ": the input Hessian has " + std::to_string(H->size()) + " entries, expected " + std::to_string(in) +
                         "² = " + std::to_string(in * in));
      if (!order.empty()) {
        Hr = permute_hessian(*H, order);
        H = &Hr;
      }
    }
    // Calibration rows in the basis the layer's input arrives in (down_proj: reordered by the fold).
    const SiteRows* X = rows[s];
    SiteRows folded_rows;
    if (X && site == ActivationSite::FfnHidden && !order.empty()) {
      folded_rows.width = X->width;
      folded_rows.data.resize(X->data.size());
      for (int64_t i = 0; i < X->count(); ++i)
        for (int64_t q = 0; q < in; ++q) folded_rows.data[size_t(i * in + q)] = X->data[size_t(i * in + order[size_t(q)])];
      X = &folded_rows;
    }
    AtomClipChoice clip;
    if (o.clip == "default") clip = {o.weight_clip, o.act_clip};
    if (o.clip == "search") {
      if (!X || X->width != in || X->count() == 0)
        throw InputError(name + ": --clip search needs calibration activations of width " + std::to_string(in));
      AtomOptions rtn = o;
      rtn.gptq = false;
      const std::vector<float> ref = reference_output(Wr, *X, gathered ? order : std::vector<int32_t>());
      double best = -1;
      for (float cw : kAtomClipGrid) {
        W4A4LinearData d = quantize_linear(Wr, n, rtn, cw, 1.0f, nullptr, name, nullptr);
        if (gathered) d.order = order;
        for (float ca : kAtomClipGrid) {
          d.act_clip = ca;
          const double e = output_error(d, *X, ref);
          if (best < 0 || e < best) {
            best = e;
            clip = {cw, ca, e, 0};
          }
        }
      }
      // The objective at Atom's default ratios, for the record.
      W4A4LinearData d = quantize_linear(Wr, n, rtn, kW4A4WeightClip, kW4A4ActClip, nullptr, name, nullptr);
      if (gathered) d.order = order;
      clip.error_default = output_error(d, *X, ref);
    }
    double herr = 0;
    W4A4LinearData d = quantize_linear(Wr, n, o, clip.weight, clip.act, H, name, &herr);
    if (gathered) d.order = order;
    if (slot.bias) d.bias = lk.get(name + ".bias", {slot.out});  // permuted with the rows by the ffn_hidden fold
    res.linears.emplace_back(name, std::move(d));
    res.sites.push_back(site);
    res.clips.push_back(clip);
    res.hessian_errors.push_back(herr);
  }
  return res;
}

}  // namespace sq
