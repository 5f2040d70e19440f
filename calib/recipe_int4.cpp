// Per-linear quantizer of --scheme w4a16: every linear's weight group-wise INT4 by RTN or GPTQ
// (calib/int4_layer_quantizer.h), FP16 scales, biases FP32; with GPTQ the Hessian of the linear's
// input site, sequential (layer by layer through the already-quantized layers) or from the
// calibration file. Mixture of experts: the router stays FP32; every expert's gate/up use the
// ffn_input Hessian (all tokens, not only those routed to the expert), every expert's down_proj the
// ffn_hidden Hessian pooled over all experts' inputs (lib/model/observer.h) — approximations of the
// per-expert Hessians, which no statistic records.
#include "calib/recipe_schemes.h"
#include "core/error.h"
#include "model/w4a16_linear.h"

namespace sq {

namespace {

/// Writes one W4A16 linear: weight I4x2 (symmetric) / U4x2 (asymmetric) [out, in], weight_scale
/// F16 [out, ⌈in/g⌉], (asymmetric) weight_zero U4x2 [out, ⌈in/g⌉], bias F32 [out] (docs/formats.md).
void write_int4_linear(SqmWriter& w, const Int4Projection& p, const Tensor* bias) {
  const Int4Weights& q = p.weights;
  const int64_t ng = int4_groups_per_row(q);
  w.add_tensor(p.name + ".weight", q.asym ? SqmDType::U4x2 : SqmDType::I4x2, {q.out, q.in}, q.packed.data(), q.packed.size());
  w.add_tensor(p.name + ".weight_scale", SqmDType::F16, {q.out, ng}, q.scales_f16.data(), q.scales_f16.size() * 2);
  if (q.asym) w.add_tensor(p.name + ".weight_zero", SqmDType::U4x2, {q.out, ng}, q.zeros_packed.data(), q.zeros_packed.size());
  if (bias) write_float(w, p.name + ".bias", *bias, ConvertScheme::F32);
}

/// The scale search's importance of linear `s` of layer l for RTN: the calibration file's Σx² of
/// its input site (null without a calibration file or with --observer minmax). Throws InputError
/// when the recorded width differs from the linear's.
const std::vector<double>* importance(const ConvertInputs& in, int l, const LinearSlot& s) {
  const LayerStats* st = in.stats(l);
  if (!st || !in.o.int4.scale_search || in.o.int4.gptq) return nullptr;
  const ChannelStats& c = st->inputs.at(size_t(s.site));
  if (static_cast<int64_t>(c.sum_sq.size()) != s.in)
    throw InputError(in.o.calib_path + ": layer " + std::to_string(l) + " site " + activation_site_name(s.site) + " records " +
                     std::to_string(c.sum_sq.size()) + " channels, " + s.name + " reads " + std::to_string(s.in));
  return &c.sum_sq;
}

class Int4Quantizer final : public LinearQuantizer {
 public:
  void check(const ConvertInputs& in) const override {
    if (in.o.int4.gptq && in.o.calib_path.empty())
      throw UsageError("--gptq needs --calib (a calibration file from sq-calibrate, for the Hessians)");
  }
  bool rereads_calibration_text(const ConvertInputs& in) const override { return in.o.int4.gptq && in.hessian_mode == "sequential"; }

  void prepare(ConvertInputs& in, ConvertSummary& summary) override {
    validate_int4_options(in.o.int4);
    if (!in.o.int4.gptq) return;
    const std::string& mode = in.hessian_mode;
    if (mode == "sequential") {
      if (!in.can_redraw) throw UsageError("--gptq-hessians sequential needs the tokenizer (give --tokenizer)");
      inputs_ = std::make_unique<LayerInputs>(in, true,
                                              in.o.gptq_hessians == "auto" ? "--gptq (sequential Hessians, the --gptq-hessians auto default)"
                                                                           : "--gptq-hessians sequential",
                                              "or use the Hessians stored by sq-calibrate --hessian: --gptq-hessians file");
    } else {
      for (size_t l = 0; l < in.calib.layers.size(); ++l)
        if (in.calib.layers[l].hessians.size() != size_t(kActivationSites))
          throw InputError(in.o.calib_path + ": no GPTQ Hessians for layer " + std::to_string(l) +
                           " (record them with sq-calibrate --hessian, or let sq-convert recompute them from the calibration text)");
    }
    summary.hessian_source = mode;
  }

  void convert_layer(ConvertInputs& in, LayerWork& w, SqmWriter& out, ConvertSummary& summary) override {
    const bool sequential = inputs_ && inputs_->sequential();
    const auto H = sequential ? inputs_->sequential_hessians(w.layer, *w.fp32) : in.file_hessians(w.layer);
    DecoderLayer converted = copy_layer_tensors(in.config, w.layer, *w.fp32);
    // From here on the layer's weights are needed in w.tensors only: each is freed once quantized,
    // and each site's Hessian after its last linear (a streamed LLaMA-7B layer: 0.8 GB of weights,
    // 1.4 GB of Hessians, of which down_proj's alone is 0.97 GB).
    w.release_fp32();
    std::array<size_t, kActivationSites> last_use{};
    for (size_t i = 0; i < w.linears.size(); ++i)
      if (w.linears[i].quantize) last_use[size_t(w.linears[i].site)] = i + 1;
    for (size_t i = 0; i < w.linears.size(); ++i) {
      const LinearSlot& s = w.linears[i];
      if (!s.quantize) {
        write_float_linear(out, w.tensors, s, ConvertScheme::F32);
        if (sequential) linear_slot(converted, s) = dense_linear(w.tensors, s);
        continue;
      }
      Int4Projection p = quantize_linear_int4(w.tensors.get(s.name + ".weight", {s.out, s.in}), s.name, in.o.int4, H[size_t(s.site)],
                                              importance(in, w.layer, s));
      w.release_weight(s);
      if (last_use[size_t(s.site)] == i + 1) {
        if (sequential) inputs_->release_hessian(s.site);
        else in.release_file_hessian(w.layer, s.site);
      }
      const Tensor bias = s.bias ? w.tensors.get(s.name + ".bias", {s.out}) : Tensor();
      write_int4_linear(out, p, s.bias ? &bias : nullptr);
      if (sequential) linear_slot(converted, s) = std::make_unique<W4A16Linear>(p.weights, bias);
      summary.int4.push_back({p.name, {}, p.hessian_error});  // the weights are written, not kept
    }
    if (sequential) inputs_->advance(w.layer, converted);  // the quantized layer produces the next layer's inputs
  }

  nlohmann::json describe(const ConvertInputs& in, const ConvertSummary& summary) const override {
    const ConvertOptions& o = in.o;
    nlohmann::json q = {{"scheme", scheme_name(o.scheme)}};
    q["group_size"] = o.int4.group_size;
    q["symmetric"] = !o.int4.asym;
    q["method"] = o.int4.gptq ? "gptq" : "rtn";
    q["observer"] = o.int4.scale_search ? "mse" : "minmax";
    q["quantize_head"] = o.quantize_head;
    if (o.int4.scale_search)
      q["importance"] = o.int4.gptq ? "hessian diagonal" : (in.calib.layers.empty() ? "uniform" : "calibration sum of squares");
    if (o.int4.gptq)
      q["gptq"] = {{"act_order", o.int4.act_order}, {"damp", o.int4.damp}, {"static_groups", o.int4.act_order}, {"hessians", summary.hessian_source}};
    return q;
  }

 private:
  std::unique_ptr<LayerInputs> inputs_;
};

}  // namespace

std::unique_ptr<LinearQuantizer> make_int4_quantizer() { return std::make_unique<Int4Quantizer>(); }

}  // namespace sq
