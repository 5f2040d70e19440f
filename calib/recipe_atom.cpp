// Per-linear quantizer of --scheme w4a4-atom (Atom, Zhao et al. 2024): outlier channels of every
// input site from the calibration sum of squares, reordered (gathered at run time, or folded into
// the producers for ffn_hidden: calib/channel_reorder.h), INT4 groups + INT8/FP32 outliers, weight
// and activation clipping (default ratios or --clip search), optional GPTQ; biases FP32
// (calib/atom_layer_quantizer.h). Mixture of experts: the router stays FP32; every expert's gate/up
// read the ffn_input site (one reorder, its statistics over all tokens), every expert's down_proj
// the ffn_hidden site pooled over the experts (lib/model/observer.h): one outlier set for all.
#include "calib/channel_reorder.h"
#include "calib/recipe_schemes.h"
#include "core/error.h"

namespace sq {

namespace {

/// Rows per site captured for --clip search (every k-th calibration token).
constexpr int64_t kAtomClipRows = 2048;

/// Packs INT4 codes (one per byte, [−8, 7]) two per byte over the flat element order (I4x2).
std::vector<uint8_t> pack_i4x2(const std::vector<int8_t>& codes) {
  std::vector<uint8_t> b((codes.size() + 1) / 2, 0);
  for (size_t i = 0; i < codes.size(); ++i) {
    const uint8_t nib = static_cast<uint8_t>(codes[i] & 0xF);
    b[i / 2] |= static_cast<uint8_t>((i & 1) ? nib << 4 : nib);
  }
  return b;
}

/// Writes one W4A4 (Atom) linear (docs/formats.md): weight I4x2 [out, in − n], weight_scale F16
/// [out, G], weight_outlier I8 [out, n] + weight_outlier_scale F32 [out] (INT8 outliers) or
/// weight_outlier F32 [out, n] (FP32 outliers), act_clip F32 [1], bias F32 [out].
void write_atom_linear(SqmWriter& w, const std::string& name, const W4A4LinearData& d) {
  const int64_t inn = d.in - d.n_outlier, G = w4a4_stored_groups(inn, d.group);
  const auto packed = pack_i4x2(d.codes);
  w.add_tensor(name + ".weight", SqmDType::I4x2, {d.out, inn}, packed.data(), packed.size());
  w.add_tensor(name + ".weight_scale", SqmDType::F16, {d.out, G}, d.scales_f16.data(), d.scales_f16.size() * 2);
  if (d.n_outlier > 0 && d.outlier_format == W4A4OutlierFormat::Int8) {
    w.add_tensor(name + ".weight_outlier", SqmDType::I8, {d.out, d.n_outlier}, d.outlier_codes.data(), d.outlier_codes.size());
    w.add_tensor(name + ".weight_outlier_scale", SqmDType::F32, {d.out}, d.outlier_scales.data(), d.outlier_scales.size() * 4);
  } else if (d.n_outlier > 0) {
    w.add_tensor(name + ".weight_outlier", SqmDType::F32, {d.out, d.n_outlier}, d.outlier_weights.data(), d.outlier_weights.size() * 4);
  }
  w.add_tensor(name + ".act_clip", SqmDType::F32, {1}, &d.act_clip, 4);
  if (!d.bias.empty()) write_float(w, name + ".bias", d.bias, ConvertScheme::F32);
}

/// Widths of the four input sites of a layer.
std::array<int64_t, kActivationSites> site_widths(const ModelConfig& c) {
  return {c.dim, int64_t(c.n_heads) * c.head_dim, c.dim, c.hidden_dim};
}

class AtomQuantizer final : public LinearQuantizer {
 public:
  void check(const ConvertInputs& in) const override {
    const AtomOptions& a = in.o.atom;
    validate_atom_options(a);
    bool outliers = false;
    for (int64_t width : {int64_t(in.config.dim), int64_t(in.config.n_heads) * in.config.head_dim, int64_t(in.config.hidden_dim)})
      outliers |= atom_outlier_count(width, a.outlier_channels) > 0;  // UsageError for a count ≥ a width
    if (outliers && in.o.calib_path.empty())
      throw UsageError("--scheme w4a4-atom picks outlier channels from calibration statistics: give --calib (or --outlier-channels 0)");
    if (a.gptq && in.o.calib_path.empty()) throw UsageError("--gptq needs --calib (a calibration file from sq-calibrate, for the Hessians)");
    if (a.clip == "search" && in.o.calib_path.empty())
      throw UsageError("--clip search needs --calib (its text, seed and windows give the calibration activations)");
  }
  bool rereads_calibration_text(const ConvertInputs& in) const override {
    return (in.o.atom.gptq && in.hessian_mode == "sequential") || in.o.atom.clip == "search";
  }

  void prepare(ConvertInputs& in, ConvertSummary& summary) override {
    const AtomOptions& a = in.o.atom;
    const bool gptq = a.gptq, clip_search = a.clip == "search";
    if (!gptq && !clip_search) return;
    const std::string& mode = in.hessian_mode;
    if (clip_search && !in.can_redraw) throw UsageError("--clip search needs the tokenizer (give --tokenizer)");
    if (mode == "sequential" || clip_search) {
      if (!in.can_redraw) throw UsageError("--gptq-hessians sequential needs the tokenizer (give --tokenizer)");
      inputs_ = clip_search ? std::make_unique<LayerInputs>(in, true, "--clip search", "")
                            : std::make_unique<LayerInputs>(in, true,
                                                            in.o.gptq_hessians == "auto"
                                                                ? "--gptq (sequential Hessians, the --gptq-hessians auto default)"
                                                                : "--gptq-hessians sequential",
                                                            "or use the Hessians stored by sq-calibrate --hessian: --gptq-hessians file");
    }
    if (gptq && mode == "file") prepare_gptq_hessians(in, summary);  // checks the file's Hessians
    if (gptq) summary.hessian_source = mode;
    sequential_hessians_ = gptq && mode == "sequential";
  }

  void convert_layer(ConvertInputs& in, LayerWork& w, SqmWriter& out, ConvertSummary& summary) override {
    const AtomOptions& a = in.o.atom;
    const int l = w.layer;
    std::array<const std::vector<double>*, kActivationSites> H{};
    if (sequential_hessians_) H = inputs_->sequential_hessians(l, *w.fp32);
    else if (a.gptq) H = in.file_hessians(l);
    std::array<SiteRows, kActivationSites> captured;
    std::array<const SiteRows*, kActivationSites> rows{};
    if (a.clip == "search") {
      captured = inputs_->rows(l, *w.fp32, kAtomClipRows);
      for (int s = 0; s < kActivationSites; ++s) rows[size_t(s)] = &captured[size_t(s)];
    }
    const AtomLayer al = quantize_layer_atom(w.tensors, l, a, in.stats(l), H, rows);
    const std::string p = names::layer(l);
    for (ActivationSite site : {ActivationSite::AttnInput, ActivationSite::AttnOutput, ActivationSite::FfnInput}) {
      const auto& ord = al.orders[size_t(site)];
      if (!ord.empty())
        out.add_tensor(p + activation_site_name(site) + ".order", SqmDType::I32, {int64_t(ord.size())}, ord.data(), ord.size() * 4);
    }
    DecoderLayer converted = copy_layer_tensors(in.config, l, *w.fp32);
    size_t k = 0;
    for (const LinearSlot& s : w.linears) {
      if (!s.quantize) {  // the MoE router: FP32
        write_float_linear(out, w.tensors, s, ConvertScheme::F32);
        linear_slot(converted, s) = dense_linear(w.tensors, s);
        continue;
      }
      const auto& [name, data] = al.linears[k];
      write_atom_linear(out, name, data);
      summary.atom.push_back({name, al.n_outlier[size_t(al.sites[k])], al.clips[k], al.hessian_errors[k]});
      linear_slot(converted, s) = std::make_unique<W4A4Linear>(data);
      ++k;
    }
    if (inputs_) inputs_->advance(l, converted);  // the converted layer produces the next layer's inputs
  }

  nlohmann::json describe(const ConvertInputs& in, const ConvertSummary& summary) const override {
    const AtomOptions& a = in.o.atom;
    nlohmann::json q = {{"scheme", scheme_name(in.o.scheme)}};
    q["group_size"] = a.group_size;
    q["symmetric"] = true;
    q["method"] = a.gptq ? "gptq" : "rtn";
    q["quantize_head"] = in.o.quantize_head;
    q["outlier_channels"] = a.outlier_channels < 0 ? nlohmann::json("auto") : nlohmann::json(a.outlier_channels);
    q["outlier_format"] = to_string(a.outlier_format);
    q["outlier_selection"] = "largest calibration sum of squares per linear input";
    nlohmann::json counts = nlohmann::json::object();
    const auto widths = site_widths(in.config);
    for (int s = 0; s < kActivationSites; ++s)
      counts[activation_site_name(static_cast<ActivationSite>(s))] = atom_outlier_count(widths[size_t(s)], a.outlier_channels);
    q["outliers_per_site"] = counts;
    q["reorder"] = {{"attn_input", "gather"}, {"attn_output", "gather"}, {"ffn_input", "gather"},
                    {"ffn_hidden", "folded into gate_proj/up_proj rows"}};
    q["activations"] = "dynamic per token: INT4 per group, INT8 outliers";
    nlohmann::json clip = {{"mode", a.clip}};
    if (a.clip == "default") {
      clip["weight"] = a.weight_clip;
      clip["act"] = a.act_clip;
    }
    if (a.clip == "search") {
      nlohmann::json per = nlohmann::json::array();
      for (const auto& lin : summary.atom) per.push_back({{"name", lin.name}, {"weight", lin.clip.weight}, {"act", lin.clip.act}});
      clip["grid"] = kAtomClipGrid;
      clip["linears"] = per;
    }
    q["clip"] = clip;
    if (a.gptq)
      q["gptq"] = {{"act_order", a.act_order}, {"damp", a.damp}, {"static_groups", true}, {"hessians", summary.hessian_source},
                   {"outliers", "error-compensated, quantized after the INT4 columns"}};
    q["kv_cache"] = "fp32";
    return q;
  }

 private:
  std::unique_ptr<LayerInputs> inputs_;
  bool sequential_hessians_ = false;
};

}  // namespace

std::unique_ptr<LinearQuantizer> make_atom_quantizer() { return std::make_unique<AtomQuantizer>(); }

}  // namespace sq
