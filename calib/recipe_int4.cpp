// Per-linear quantizer of --scheme w4a16: every linear's weight group-wise INT4 by RTN or GPTQ
// (calib/int4_layer_quantizer.h), FP16 scales, biases FP32; with GPTQ the Hessian of the linear's
// input site, sequential (layer by layer through the already-quantized layers) or from the
// calibration file. Mixture of experts: the router stays FP32; every expert's gate/up use the
// ffn_input Hessian (all tokens, not only those routed to the expert), every expert's down_proj the
// ffn_hidden Hessian pooled over all experts' inputs (lib/model/observer.h) — approximations of the
// per-expert Hessians, which no statistic records. With --awq the smoothing step has scaled each
// layer first (calib/awq.h); the importance and Hessians are then those of the scaled inputs.
#include <cmath>
#include <map>
#include <set>

#include "calib/hessian.h"
#include "calib/mixed_precision.h"
#include "calib/recipe_schemes.h"
#include "core/error.h"
#include "model/w4a16_linear.h"
#include "model/w8a16_linear.h"
#include "quant/q4k_layout.h"

namespace sq {

namespace {

/// Writes one W4A16 linear: weight I4x2 (symmetric) / U4x2 (asymmetric) [out, in], weight_scale
/// F16 [out, ⌈in/g⌉], (asymmetric) weight_zero U4x2 [out, ⌈in/g⌉], bias F32 [out] (docs/formats.md);
/// K-quant weights (--k-quant): weight U4x2 [out, in] and weight_superblock_scale U8 [out, S, 16]
/// (quant/q4k_layout.h) instead of the scales and zero points.
void write_int4_linear(SqmWriter& w, const Int4Projection& p, const Tensor* bias) {
  const Int4Weights& q = p.weights;
  const int64_t ng = int4_groups_per_row(q);
  w.add_tensor(p.name + ".weight", q.asym ? SqmDType::U4x2 : SqmDType::I4x2, {q.out, q.in}, q.packed.data(), q.packed.size());
  if (q.k_quant()) {
    w.add_tensor(p.name + ".weight_superblock_scale", SqmDType::U8, {q.out, q4k_superblocks(ng), kQ4kHeadBytes}, q.superblock_scales.data(),
                 q.superblock_scales.size());
    if (bias) write_float(w, p.name + ".bias", *bias, ConvertScheme::F32);
    return;
  }
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

/// The calibration's Σx² of linear `s`'s input site (null without a calibration file); as
/// importance() but whatever the method.
const std::vector<double>* sum_sq(const ConvertInputs& in, int l, const LinearSlot& s) {
  const LayerStats* st = in.stats(l);
  if (!st) return nullptr;
  const ChannelStats& c = st->inputs.at(size_t(s.site));
  return static_cast<int64_t>(c.sum_sq.size()) == s.in ? &c.sum_sq : nullptr;
}

/// Σ_j a_j Σ_i (W[i, j] − Ŵ[i, j])² with a = `imp` (uniform when null): the error energy that the
/// high format's KLD estimate scales by.
double weighted_error(const Tensor& W, const float* what, const std::vector<double>* imp) {
  const int64_t out = W.dim(0), in = W.dim(1);
  double e = 0;
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j = 0; j < in; ++j) {
      const double d = double(W.data()[i * in + j]) - double(what[i * in + j]);
      e += (imp ? (*imp)[size_t(j)] : 1.0) * d * d;
    }
  return e;
}

/// INT8 rows dequantized: [out, in].
std::vector<float> dequantize_rows(const Int8Rows& r, int64_t out, int64_t in) {
  std::vector<float> w(size_t(out * in));
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j = 0; j < in; ++j) w[size_t(i * in + j)] = float(r.codes[size_t(i * in + j)]) * r.steps[size_t(i)];
  return w;
}

class Int4Quantizer final : public LinearQuantizer {
 public:
  void check(const ConvertInputs& in) const override {
    if (in.o.int4.gptq && in.o.calib_path.empty())
      throw UsageError("--gptq needs --calib (a calibration file from sq-calibrate, for the Hessians)");
  }
  bool mixes_precision() const override { return true; }

  /// "int4" by --token-embedding-type int4, and by "auto" when the head is untied: the embedding
  /// is then only looked up, as llama.cpp's Q4_0 / Q4_K_M files store an untied model's token_embd
  /// in 4 bits. Measured on Qwen2.5-Coder-1.5B (g128 RTN, 4 WikiText-2 chunks): KLD 0.0973 (INT8)
  /// against 0.0968 (INT4), 1.150 → 1.036 GB (docs/results.md section 9). A tied head stays INT8
  /// rows unless asked (a 4-bit output layer costs more: stories260K's test).
  std::string embedding_format(const ConvertInputs& in) const override {
    const std::string& t = in.o.token_embedding_type;
    if (!in.o.quantize_head || t == "int8") return LinearQuantizer::embedding_format(in);  // FP32, INT8, or its refusal
    if (t == "int4" || !in.config.tied_embeddings) return "int4";
    return LinearQuantizer::embedding_format(in);
  }

  /// --token-embedding-type int4: the embedding [vocab, dim] in the linears' INT4 format (group
  /// size, symmetry, scale search with uniform importance: no activation statistic weighs the
  /// columns of a lookup table), always by RTN; written under the linear names of a W4A16
  /// projection so that a tied head loads as that W4A16 linear.
  void write_embedding(const ConvertInputs& in, SqmWriter& out) override {
    if (embedding_format(in) != "int4") return LinearQuantizer::write_embedding(in, out);
    Int4Options eo = in.o.int4;
    eo.gptq = false;
    eo.act_order = false;
    write_int4_linear(out, quantize_linear_int4(in.base.tensors.at(names::kEmbed), "model.embed_tokens", eo, nullptr, nullptr), nullptr);
  }
  bool rereads_calibration_text(const ConvertInputs& in) const override {
    return in.o.awq || (in.o.int4.gptq && in.hessian_mode == "sequential") || (mixed(in.o) && in.o.mixed_sensitivity_from.empty());
  }
  bool smooths() const override { return awq_; }

  void prepare(ConvertInputs& in, ConvertSummary& summary) override {
    validate_int4_options(in.o.int4);
    if (in.o.awq) {
      if (in.o.calib_path.empty()) throw UsageError("--awq needs --calib (the per-channel activation statistics of sq-calibrate)");
      if (mixed(in.o)) throw UsageError("--awq does not combine with --bits-per-weight / --max-kld yet");
      if (in.o.int4.gptq) {
        // The sequential Hessians run the layer as converted; with AWQ its norms are scaled too,
        // which that path does not carry: GPTQ after AWQ uses the calibration file's Hessians,
        // transformed by the scaling (calib/hessian.h transform_hessian).
        if (in.o.gptq_hessians == "sequential")
          throw UsageError("--awq with --gptq needs --gptq-hessians file (a calibration file from sq-calibrate --hessian)");
        in.hessian_mode = "file";
      }
      awq_ = true;
    }
    if (mixed(in.o)) choose_precision(in, summary);
    if (in.o.int4.gptq) inputs_ = prepare_gptq_hessians(in, summary);
  }

  void convert_layer(ConvertInputs& in, LayerWork& w, SqmWriter& out, ConvertSummary& summary) override {
    const bool sequential = inputs_ && inputs_->sequential();
    const auto H = sequential ? inputs_->sequential_hessians(w.layer, *w.fp32) : in.file_hessians(w.layer);
    DecoderLayer converted = copy_layer_tensors(in.config, w.layer, *w.fp32);
    // From here on the layer's weights are needed in w.tensors only: each is freed once quantized,
    // and each site's Hessian after its last linear (a streamed LLaMA-7B layer: 0.8 GB of weights,
    // 1.4 GB of Hessians, of which down_proj's alone is 0.97 GB).
    w.release_fp32();
    std::map<ActivationSite, std::vector<double>> scaled_hessians;  // --awq --gptq: H' of this layer's scaled sites
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
      const Tensor W = w.tensors.get(s.name + ".weight", {s.out, s.in});
      const bool int8 = int8_.count(s.name) > 0;  // mixed precision: INT8 rows, run as W8A16
      Int8Rows r;
      Int4Projection p;
      if (int8) {
        r = quantize_int8_rows_fp16_steps(W, s.name);
      } else {
        const std::vector<double>* imp = importance(in, w.layer, s);
        const std::vector<double>* h = H[size_t(s.site)];
        std::vector<double> scaled_imp;
        if (const auto f = w.smoothing.find(s.site); f != w.smoothing.end()) {
          // --awq scaled this input: the statistics and Hessians are of the unscaled input X, the
          // linear reads X / s: Σx² / s² and H' = S⁻¹ H S⁻¹ (once per site).
          if (imp) {
            scaled_imp = *imp;
            for (size_t j = 0; j < scaled_imp.size(); ++j) scaled_imp[j] /= double(f->second[j]) * double(f->second[j]);
            imp = &scaled_imp;
          }
          if (h) {
            auto [it, fresh] = scaled_hessians.try_emplace(s.site);
            if (fresh) {
              it->second = *h;
              transform_hessian(it->second, s.in, f->second, 0);
            }
            h = &it->second;
          }
        }
        p = quantize_linear_int4(W, s.name, in.o.int4, h, imp);
      }
      w.release_weight(s);
      if (last_use[size_t(s.site)] == i + 1) {
        scaled_hessians.erase(s.site);
        if (sequential) inputs_->release_hessian(s.site);
        else in.release_file_hessian(w.layer, s.site);
      }
      const Tensor bias = s.bias ? w.tensors.get(s.name + ".bias", {s.out}) : Tensor();
      if (int8) {
        write_int8_rows(out, r, s.out, s.in, s.name);
        if (s.bias) write_float(out, s.name + ".bias", bias, ConvertScheme::F32);
        if (sequential) linear_slot(converted, s) = std::make_unique<W8A16Linear>(std::move(r.codes), std::move(r.steps), s.out, s.in, bias);
        continue;
      }
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
    if (o.int4.k_quant) q["layout"] = "q4_k";  // two-level scales: weight_superblock_scale (quant/q4k_layout.h)
    q["method"] = o.int4.gptq ? "gptq" : "rtn";
    q["observer"] = o.int4.scale_search ? "mse" : "minmax";
    q["quantize_head"] = o.quantize_head;
    if (o.int4.scale_search)
      q["importance"] = o.int4.gptq ? "hessian diagonal" : (in.calib.layers.empty() ? "uniform" : "calibration sum of squares");
    if (o.int4.gptq)
      q["gptq"] = {{"act_order", o.int4.act_order}, {"damp", o.int4.damp}, {"static_groups", o.int4.act_order || o.int4.k_quant}, {"hessians", summary.hessian_source}};
    if (!summary.mixed.is_null()) q["mixed_precision"] = summary.mixed;
    if (o.awq) {
      nlohmann::json groups = nlohmann::json::array();
      for (const SmoothingGroup& g : summary.groups)
        groups.push_back({{"layer", g.layer}, {"site", activation_site_name(g.site)}, {"alpha", g.alpha}});
      q["awq"] = {{"factors", "rms^alpha / sqrt(max * min)"}, {"groups", groups}};
    }
    return q;
  }

 private:
  static bool mixed(const ConvertOptions& o) { return o.mixed.bits_per_weight > 0 || o.mixed.max_kld > 0; }

  /// Mixed precision (calib/mixed_precision.h): measures every quantized linear's single-linear
  /// KLD in this scheme's 4-bit format on o.mixed_windows calibration windows, estimates its KLD
  /// as INT8 rows, assigns the formats within the budget and records the choice in summary.mixed.
  /// The measurement quantizes by RTN with the scale search weighted by the calibration's Σx² (also
  /// for --gptq, whose sequential result depends on the earlier layers' formats): a proxy for the
  /// final 4-bit weights. The INT8 KLD is the 4-bit KLD scaled by the ratio of the two formats'
  /// Σx²-weighted squared weight errors (the KLD is second order in a small perturbation).
  void choose_precision(ConvertInputs& in, ConvertSummary& summary) {
    const ConvertOptions& o = in.o;
    const std::string what = o.mixed.bits_per_weight > 0 ? "--bits-per-weight" : "--max-kld";
    if (in.streamed())
      throw UsageError(in.src.path + ": " + what + " measures every linear on the whole model; open it whole (not layer by layer)");
    const bool measure = o.mixed_sensitivity_from.empty();
    if (measure && o.calib_path.empty()) throw UsageError(what + " needs --calib (its windows measure each linear's sensitivity)");
    if (measure && !in.can_redraw) throw UsageError(what + " needs the tokenizer (give --tokenizer)");
    if (o.mixed_windows < 1) throw UsageError("--mixed-windows must be at least 1, got " + std::to_string(o.mixed_windows));
    const ModelConfig& c = in.config;
    std::vector<LinearSlot> slots;
    for (int l = 0; l < c.n_layers; ++l)
      for (const LinearSlot& s : decoder_layer_linears(c, l))
        if (s.quantize) slots.push_back(s);
    Int4Options rtn = o.int4;
    rtn.gptq = false;
    std::vector<PrecisionCandidate> cand(slots.size());
    std::map<std::string, size_t> index;  // slot name -> position in slots / cand
    for (size_t i = 0; i < slots.size(); ++i) index[slots[i].name] = i;
    const auto index_of = [&](const LinearSlot& s) { return index.at(s.name); };
    for (size_t i = 0; i < slots.size(); ++i) {  // the two formats' storage: the 4-bit layout's / INT8 codes and FP32 row steps
      const LinearSlot& s = slots[i];
      cand[i].name = s.name;
      cand[i].weights = s.out * s.in;
      // flat asymmetric files have integer zero points (to_int4_weights), K-quant files their heads
      cand[i].bits_low = int4_bits_per_weight(s.in, o.int4.group_size, o.int4.asym, false, o.int4.k_quant);
      cand[i].bits_high = 8.0 + 32.0 / double(s.in);
    }
    // Each linear's 4-bit weights, quantized once (the sensitivity pass and every check round use them).
    std::vector<std::unique_ptr<Int4Weights>> q4(slots.size());
    const auto int4_weights = [&](size_t i) -> const Int4Weights& {
      if (!q4[i]) {
        const LinearSlot& s = slots[i];
        q4[i] = std::make_unique<Int4Weights>(quantize_linear_int4(in.base.get(s.name + ".weight", {s.out, s.in}), s.name, rtn, nullptr,
                                                                   o.int4.scale_search ? sum_sq(in, s.layer, s) : nullptr)
                                                  .weights);
      }
      return *q4[i];
    };
    const auto low = [&](const LinearSlot& s) -> std::unique_ptr<Linear> {
      return std::make_unique<W4A16Linear>(int4_weights(index_of(s)), s.bias ? in.base.get(s.name + ".bias", {s.out}) : Tensor());
    };
    nlohmann::json sensitivity;
    // The calibration windows: those the sensitivities are measured on, and (when they can be drawn)
    // those the chosen assignment's own KLD is checked on — for reused sensitivities, the same
    // windows as their measurement (the first N of the calibration's draw).
    std::vector<std::vector<int32_t>> windows;
    const auto draw = [&](int64_t n) {
      return in.redraw_windows(in.calibration_text(what + " (each linear's sensitivity on the calibration windows)", ""), n);
    };
    if (measure) {
      windows = draw(o.mixed_windows);
      const std::vector<double> kld = single_linear_kld(*in.src.model, windows, slots, low, o.mixed_progress);
      for (size_t i = 0; i < slots.size(); ++i) {  // the INT8 estimate: kld × (INT8 error / 4-bit error), Σx²-weighted
        const LinearSlot& s = slots[i];
        const Tensor W = in.base.get(s.name + ".weight", {s.out, s.in});
        const std::vector<double>* imp = sum_sq(in, s.layer, s);
        std::vector<float> deq(size_t(s.out * s.in));
        dequantize_int4(int4_weights(i), deq.data());
        const double err4 = weighted_error(W, deq.data(), imp);
        const double err8 = weighted_error(W, dequantize_rows(quantize_int8_rows_fp16_steps(W, s.name), s.out, s.in).data(), imp);
        cand[i].kld_low = kld[i];
        cand[i].kld_high = err4 > 0 ? kld[i] * err8 / err4 : 0.0;
      }
      int64_t tokens = 0;
      for (const auto& w : windows) tokens += int64_t(w.size());
      sensitivity = {{"windows", windows.size()}, {"tokens", tokens}, {"method", "single-linear KLD, RTN 4-bit"}};
    } else {
      sensitivity = reuse_sensitivity(in, slots, cand);
      if (!o.calib_path.empty() && in.can_redraw) windows = draw(o.mixed_windows_given ? o.mixed_windows : sensitivity.value("windows", o.mixed_windows));
    }
    // The assignment's KLD measured with every linear in its format at once (RTN 4-bit, as the
    // sensitivities); with --max-kld tightened until that is within the budget
    // (assign_precision_checked). Without windows (reused sensitivities, no --calib) the estimate only.
    const auto mixed_linear = [&](const PrecisionAssignment& as) {
      return [&](const LinearSlot& s) -> std::unique_ptr<Linear> {
        if (!as.high[index_of(s)]) return low(s);
        Int8Rows r = quantize_int8_rows_fp16_steps(in.base.get(s.name + ".weight", {s.out, s.in}), s.name);
        return std::make_unique<W8A16Linear>(std::move(r.codes), std::move(r.steps), s.out, s.in,
                                             s.bias ? in.base.get(s.name + ".bias", {s.out}) : Tensor());
      };
    };
    CheckedAssignment checked;
    if (windows.empty()) checked.assignment = assign_precision(cand, o.mixed);
    else
      checked = assign_precision_checked(cand, o.mixed, [&](const PrecisionAssignment& as) {
        return replaced_model_kld(*in.src.model, windows, slots, mixed_linear(as));
      });
    const PrecisionAssignment& a = checked.assignment;
    nlohmann::json linears = nlohmann::json::array();
    for (size_t i = 0; i < cand.size(); ++i) {
      if (a.high[i]) int8_.insert(cand[i].name);
      linears.push_back({{"name", cand[i].name}, {"format", a.high[i] ? "int8" : "int4"}, {"kld_int4", cand[i].kld_low},
                         {"kld_int8_estimate", cand[i].kld_high}, {"bits", a.high[i] ? cand[i].bits_high : cand[i].bits_low}});
    }
    summary.mixed = {{"budget", o.mixed.bits_per_weight > 0 ? nlohmann::json{{"bits_per_weight", o.mixed.bits_per_weight}}
                                                             : nlohmann::json{{"max_kld", o.mixed.max_kld}}},
                     {"sensitivity", sensitivity},
                     {"bits_per_weight", a.bits_per_weight},
                     {"estimated_kld", a.estimated_kld},
                     {"calibration_kld", checked.rounds > 0 ? nlohmann::json(checked.measured_kld) : nlohmann::json()},
                     {"assignment_rounds", checked.rounds},
                     {"int8_linears", int8_.size()},
                     {"linears", linears}};
  }

  /// --sensitivity-from: fills cand[i].kld_low / kld_high of every slot from the file's recorded
  /// mixed_precision.linears; returns its sensitivity object with "from" added. Throws InputError
  /// naming the file when it records no sensitivities, another source model or 4-bit format, or
  /// not exactly these linears.
  static nlohmann::json reuse_sensitivity(const ConvertInputs& in, const std::vector<LinearSlot>& slots,
                                          std::vector<PrecisionCandidate>& cand) {
    const std::string& path = in.o.mixed_sensitivity_from;
    const std::shared_ptr<SqmFile> f = SqmFile::open(path, false);
    const nlohmann::json& h = f->header();
    const nlohmann::json q = h.value("quantization", nlohmann::json::object());
    if (!q.contains("mixed_precision"))
      throw InputError(path + ": records no sensitivities (not written by sq-convert --bits-per-weight / --max-kld)");
    if (h.value("source", nlohmann::json::object()).value("fingerprint", std::string()) != in.fingerprint())
      throw InputError(path + ": was converted from another model (source fingerprint differs from " + in.src.path + "'s)");
    const Int4Options& o = in.o.int4;
    const std::string layout = q.value("layout", std::string());
    if (q.value("group_size", 0) != o.group_size || q.value("symmetric", true) != !o.asym ||
        q.value("observer", std::string()) != (o.scale_search ? "mse" : "minmax") || (layout == "q4_k") != o.k_quant)
      throw InputError(path + ": its sensitivities are for group size " + std::to_string(q.value("group_size", 0)) +
                       (q.value("symmetric", true) ? " symmetric" : " asymmetric") + (layout.empty() ? "" : " " + layout) + ", observer " +
                       q.value("observer", std::string("?")) + ", not this conversion's 4-bit format");
    const nlohmann::json& m = q.at("mixed_precision");
    const nlohmann::json& linears = m.at("linears");
    if (linears.size() != slots.size())
      throw InputError(path + ": records " + std::to_string(linears.size()) + " linears, this model has " + std::to_string(slots.size()));
    for (size_t i = 0; i < slots.size(); ++i) {
      const nlohmann::json& l = linears[i];
      if (l.value("name", std::string()) != slots[i].name)
        throw InputError(path + ": linear " + std::to_string(i) + " is '" + l.value("name", std::string()) + "', expected '" +
                         slots[i].name + "'");
      cand[i].kld_low = l.at("kld_int4").get<double>();
      cand[i].kld_high = l.at("kld_int8_estimate").get<double>();
    }
    nlohmann::json s = m.at("sensitivity");
    s["from"] = path;
    return s;
  }

  std::unique_ptr<LayerInputs> inputs_;
  std::set<std::string> int8_;  ///< mixed precision: the linears stored as INT8 rows
  bool awq_ = false;            ///< --awq: the smoothing step scales the layer (calib/awq.h)
};

}  // namespace

std::unique_ptr<LinearQuantizer> make_int4_quantizer() { return std::make_unique<Int4Quantizer>(); }

}  // namespace sq
