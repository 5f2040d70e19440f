// Per-linear quantizer of --scheme w8a8 (SmoothQuant, Xiao et al. 2023): every linear's weight
// symmetric INT8 (per-channel or per-tensor, Eq. 3.1), activations quantized at run time in the
// recorded mode, static (O3) steps Δ = absmax/127 of the (smoothed) calibrated input of the linear's
// site. The smoothing itself is the transform step (calib/recipe_smoothing.h). The MoE router stays
// FP32; expert gate/up share the ffn_input step, expert down_proj uses the ffn_hidden statistics
// pooled over every expert's input (lib/model/observer.h), i.e. one static step for all experts.
//
// GPTQ (--gptq; by default when the calibration file holds Hessians): the per-channel INT8 weights by GPTQ (Frantar et al. 2023, Algorithm 1; calib/gptq.h with
// b = 8, one group per row, symmetric: Δ = absmax/127 as round-to-nearest's) instead of rounding,
// as llm-compressor's W8A8 recipe (SmoothQuant, then GPTQ). The Hessian of each site is that of the
// FP32 model's input (sequential: recomputed layer by layer through the FP32 layers; or the
// calibration file's), carried through the smoothing and rotation steps (transform_hessian:
// H' = R·D⁻¹·H·D⁻¹·R), so GPTQ minimizes the output error on the calibration tokens of the weights
// the file holds. Activation rounding is not part of GPTQ's objective.
#include <map>

#include "calib/gptq.h"
#include "calib/hessian.h"
#include "calib/recipe_schemes.h"
#include "calib/recipe_smoothing.h"
#include "core/error.h"

namespace sq {

namespace {

/// Σ_j imp_j · Σ_i (W_ij − Δ_i·q_ij)²: the rounding error of W [out, in] quantized with `g`
/// (Eq. 3.1), each input column j weighted by imp[j] (empty: 1). With imp = the calibration's Σ_t x_j²
/// of the linear's (smoothed) input this is the diagonal approximation of the calibration-set output
/// error Σ_t ‖(W − Ŵ)x_t‖² (cross terms between columns dropped).
double weighted_rounding_error(const Tensor& W, WeightGranularity g, const std::vector<double>& imp) {
  const int64_t out = W.dim(0), in = W.dim(1);
  std::vector<int8_t> q(size_t(out * in));
  std::vector<float> scales(g == WeightGranularity::PerChannel ? size_t(out) : 1);
  quantize_weight(W.data(), out, in, g, q.data(), scales.data());
  double err = 0;
  for (int64_t i = 0; i < out; ++i) {
    const float d = scales.size() == 1 ? scales[0] : scales[size_t(i)];
    const float* w = W.data() + i * in;
    const int8_t* qi = q.data() + i * in;
    for (int64_t j = 0; j < in; ++j) {
      const double e = double(w[j]) - double(d) * qi[j];
      err += (imp.empty() ? 1.0 : imp[size_t(j)]) * e * e;
    }
  }
  return err;
}

class W8A8Quantizer final : public LinearQuantizer {
 public:
  bool smooths() const override { return smooth_; }
  bool weight_only_head() const override { return false; }
  void check(const ConvertInputs& in) const override {
    const ConvertOptions& o = in.o;
    const bool needs_calib = o.smooth || o.act == ActQuant::PerTensorStatic;
    if (needs_calib && o.calib_path.empty())
      throw UsageError(std::string("--calib is required for ") + (o.smooth ? "SmoothQuant smoothing" : "static (O3) activation scales") +
                       " (run sq-calibrate first)");
    if (o.quantize_head && o.act == ActQuant::PerTensorStatic && !o.head_fp32_activations)
      throw UsageError("--quantize-head needs a dynamic activation mode (the LM head input has no calibrated static scale) or "
                       "--head-activations fp32");
    if (o.head_fp32_activations && !o.quantize_head) throw UsageError("--head-activations applies with --quantize-head only");
    if (o.int4.gptq && o.calib_path.empty()) throw UsageError("--gptq needs --calib (a calibration file from sq-calibrate, for the Hessians)");
    if (o.int4.gptq && o.weight != WeightGranularity::PerChannel)
      throw UsageError("--gptq with --scheme w8a8 needs per-channel weights (the presets' per-tensor step is one for the whole matrix: "
                       "give --weight per-channel)");
  }
  bool rereads_calibration_text(const ConvertInputs& in) const override {
    return (in.o.smooth && in.o.alpha_auto) || (in.o.int4.gptq && in.hessian_mode == "sequential");
  }
  void prepare(ConvertInputs& in, ConvertSummary& summary) override {
    smooth_ = in.o.smooth;
    if (in.o.int4.gptq) {
      inputs_ = prepare_gptq_hessians(in, summary);
      gptq_ = true;
    } else if (in.o.w8a8_gptq_when_hessians && in.o.weight == WeightGranularity::PerChannel && !in.calib.layers.empty() &&
               first_layer_without_hessians(in) < 0) {
      in.hessian_mode = "file";
      prepare_gptq_hessians(in, summary);
      gptq_ = true;
    }
  }

  // The embedding: LinearQuantizer's (per-channel INT8 with --quantize-head, whatever --weight: one
  // outlier token must not coarsen every row). An untied head follows --weight and --act.
  // --head-activations fp32: both as the weight-only schemes write them (INT8 rows with FP16-exact
  // steps, run as W8A16: the head's input is not rounded).
  void write_embedding(const ConvertInputs& in, SqmWriter& out) override {
    if (in.o.quantize_head && in.o.head_fp32_activations)
      return write_int8_rows_fp16_steps(out, in.base.tensors.at(names::kEmbed), "model.embed_tokens");
    LinearQuantizer::write_embedding(in, out);
  }
  void write_head(const ConvertInputs& in, SqmWriter& out) override {
    if (!in.o.quantize_head) return LinearQuantizer::write_head(in, out);
    if (in.o.head_fp32_activations) return write_int8_rows_fp16_steps(out, in.lm_head(), "lm_head");
    write_int8_linear(out, in.lm_head(), nullptr, "lm_head", in.o.weight, in.o.act, 0.0f);
  }

  void convert_layer(ConvertInputs& in, LayerWork& w, SqmWriter& out, ConvertSummary& summary) override {
    const ConvertOptions& o = in.o;
    std::array<const std::vector<double>*, kActivationSites> H{};
    if (gptq_) H = inputs_ ? inputs_->sequential_hessians(w.layer, *w.fp32) : in.file_hessians(w.layer);
    std::map<ActivationSite, std::vector<double>> site_hessians;  // H' of each site, as its linears read it
    for (const LinearSlot& s : w.linears) {
      if (!s.quantize) {
        write_float_linear(out, w.tensors, s, ConvertScheme::F32);
        continue;
      }
      float step = 0.0f;
      if (o.act == ActQuant::PerTensorStatic) {
        auto it = w.smoothing.find(s.site);
        step = smoothed_static_step(in.calib.layers[size_t(w.layer)], s.site, it == w.smoothing.end() ? nullptr : &it->second);
      }
      const Tensor bias = s.bias ? w.tensors.get(s.name + ".bias", {s.out}) : Tensor();
      const Tensor W = w.tensors.get(s.name + ".weight", {s.out, s.in});
      if (o.weight == WeightGranularity::PerTensor) compare_with_per_channel(in, w, s, W, summary);
      if (!gptq_) {
        write_int8_linear(out, W, s.bias ? &bias : nullptr, s.name, o.weight, o.act, step);
        continue;
      }
      auto it = site_hessians.find(s.site);
      if (it == site_hessians.end()) {
        const std::vector<double>* h = H[size_t(s.site)];
        if (!h)
          throw InputError("GPTQ: no Hessian of layer " + std::to_string(w.layer) + "'s " + activation_site_name(s.site) +
                           " input (no calibration token reached " + s.name + ")");
        const auto f = w.smoothing.find(s.site);
        const auto r = w.rotation.find(s.site);
        it = site_hessians.emplace(s.site, *h).first;
        transform_hessian(it->second, s.in, f == w.smoothing.end() ? std::vector<float>() : f->second,
                          r == w.rotation.end() ? 0 : r->second);
      }
      const Int8Gptq q = gptq_int8(W, it->second, o.int4, s.name);
      summary.w8a8_gptq.push_back({s.name, q.gptq_error, q.rtn_error});
      write_int8_linear_codes(out, q.codes, q.steps, s.out, s.in, s.bias ? &bias : nullptr, s.name, o.act, step);
    }
    if (inputs_) inputs_->advance(w.layer, *w.fp32);  // the FP32 layer gives the next layer's inputs (file comment)
  }

  nlohmann::json describe(const ConvertInputs& in, const ConvertSummary& summary) const override {
    const ConvertOptions& o = in.o;
    nlohmann::json alphas = nlohmann::json::array();
    for (const SmoothingGroup& g : summary.groups)
      alphas.push_back({{"layer", g.layer}, {"site", activation_site_name(g.site)}, {"alpha", g.alpha}});
    nlohmann::json q = {{"scheme", scheme_name(o.scheme)}};
    q["weight"] = to_string(o.weight);
    q["act"] = to_string(o.act);
    q["preset"] = o.preset;
    q["quantize_head"] = o.quantize_head;
    if (o.quantize_head && o.head_fp32_activations) q["lm_head_activations"] = "fp32";
    q["method"] = gptq_ ? "gptq" : "rtn";
    if (gptq_)
      q["gptq"] = {{"act_order", o.int4.act_order}, {"damp", o.int4.damp}, {"hessians", summary.hessian_source == "sequential" ? "sequential (FP32 layers)" : summary.hessian_source}};
    q["smoothing"] = {{"enabled", o.smooth},
                      {"alpha", o.smooth ? (o.alpha_auto ? nlohmann::json("auto") : nlohmann::json(o.alpha)) : nlohmann::json(nullptr)},
                      {"smooth_vo", o.smooth_vo},
                      {"groups", alphas}};
    return q;
  }

 private:
  /// Adds linear s's importance-weighted rounding error per tensor and per channel to `summary`
  /// (ConvertSummary::w8a8_weight_error): importance = the calibration's Σx² of its input site
  /// divided by the squared smoothing factors (the smoothed input's Σx²), or 1 without calibration
  /// or when the site is rotated (the statistics are of the unrotated input).
  static void compare_with_per_channel(const ConvertInputs& in, const LayerWork& w, const LinearSlot& s, const Tensor& W,
                                       ConvertSummary& summary) {
    std::vector<double> imp;
    if (const LayerStats* st = in.stats(w.layer); st && !w.rotation.count(s.site) && size_t(s.site) < st->inputs.size() &&
                                                  st->inputs[size_t(s.site)].sum_sq.size() == size_t(s.in)) {
      imp = st->inputs[size_t(s.site)].sum_sq;
      if (auto it = w.smoothing.find(s.site); it != w.smoothing.end() && it->second.size() == imp.size())
        for (size_t j = 0; j < imp.size(); ++j) imp[j] /= double(it->second[j]) * double(it->second[j]);
    }
    summary.w8a8_weight_error.per_tensor += weighted_rounding_error(W, WeightGranularity::PerTensor, imp);
    summary.w8a8_weight_error.per_channel += weighted_rounding_error(W, WeightGranularity::PerChannel, imp);
    summary.w8a8_weight_error.calibration_weighted = !imp.empty();
  }

  /// GPTQ's per-channel INT8 codes of one linear and the Hessian-weighted errors of them and of
  /// round-to-nearest (the same Δ = absmax/127 per row), both on H.
  struct Int8Gptq {
    std::vector<int8_t> codes;  ///< [out, in] row-major, −127…127
    std::vector<float> steps;   ///< [out]
    double gptq_error = 0, rtn_error = 0;
  };
  static Int8Gptq gptq_int8(const Tensor& W, const std::vector<double>& H, const Int4Options& opt, const std::string& name) {
    const int64_t out = W.dim(0), in = W.dim(1);
    GptqOptions g;
    g.bits = 8;
    g.group_size = 0;  // per channel
    g.symmetric = true;
    g.damp = opt.damp;
    g.act_order = opt.act_order;
    g.name = name;
    const GptqResult r = gptq_quantize(W.data(), out, in, H, g);
    Int8Gptq q;
    q.codes.resize(r.codes.size());
    // GPTQ's codes span 0…255 around z = 128; the lowest (−128) appears only where the error
    // feedback pushed a weight past its row's absmax, and sqkit's INT8 weights are −127…127.
    bool clamped = false;
    for (size_t k = 0; k < r.codes.size(); ++k) {
      clamped = clamped || r.codes[k] == 0;
      q.codes[k] = int8_t(std::max(int(r.codes[k]) - 128, -127));
    }
    q.steps = r.scales;
    q.gptq_error = r.hessian_error;  // of r.dequantized = steps · (codes − 128), on H
    if (clamped) {  // the written weights differ from GPTQ's: their own error
      std::vector<float> what(r.codes.size());
      for (int64_t i = 0; i < out; ++i)
        for (int64_t j = 0; j < in; ++j) what[size_t(i * in + j)] = q.steps[size_t(i)] * float(q.codes[size_t(i * in + j)]);
      q.gptq_error = hessian_weighted_error(W.data(), what.data(), out, in, H);
    }
    const GptqResult rtn = rtn_quantize(W.data(), out, in, g);
    q.rtn_error = hessian_weighted_error(W.data(), rtn.dequantized.data(), out, in, H);
    return q;
  }

  bool smooth_ = false;
  bool gptq_ = false;
  std::unique_ptr<LayerInputs> inputs_;  ///< sequential Hessians (null: the calibration file's)
};

}  // namespace

std::unique_ptr<LinearQuantizer> make_w8a8_quantizer() { return std::make_unique<W8A8Quantizer>(); }

}  // namespace sq
