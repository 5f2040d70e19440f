#include "calib/converter.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "calib/calibration_text.h"
#include "calib/channel_reorder.h"
#include "calib/layerwise_runner.h"
#include "calib/smoothing_mappings.h"
#include "calib/window_sampler.h"
#include "core/error.h"
#include "formats/calibration_h5.h"
#include "formats/fingerprint.h"
#include "formats/mapped_file.h"
#include "formats/safetensors.h"
#include "formats/token_ids_file.h"
#include "formats/gguf_tokenizer.h"
#include "formats/tokenizer.h"
#include "model/sqm_model.h"
#include "model/w4a16_linear.h"
#include "model/w4a4_linear.h"
#include "model/w8a8_linear.h"

namespace sq {

namespace {

/// Writes a float tensor in the scheme's float dtype.
void write_float(SqmWriter& w, const std::string& name, const Tensor& t, ConvertScheme scheme) {
  if (scheme == ConvertScheme::F16 || scheme == ConvertScheme::BF16) {
    std::vector<uint16_t> h(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < h.size(); ++i) h[i] = scheme == ConvertScheme::F16 ? float_to_half(t.data()[i]) : float_to_bf16(t.data()[i]);
    w.add_tensor(name, scheme == ConvertScheme::F16 ? SqmDType::F16 : SqmDType::BF16, t.shape(), h.data(), h.size() * 2);
  } else {
    w.add_tensor(name, SqmDType::F32, t.shape(), t.data(), static_cast<size_t>(t.numel()) * 4);
  }
}

/// Per-input-channel expansion of smoothing factors (AttnOutput factors are per KV channel).
std::vector<float> expand_factors(const ModelConfig& c, ActivationSite site, const std::vector<float>& s) {
  const std::vector<float> ones(site == ActivationSite::AttnOutput ? size_t(c.n_heads) * c.head_dim : s.size(), 1.0f);
  const std::vector<float> inv = smoothed_absmax(c, site, ones, s);  // 1/s per input channel
  std::vector<float> out(inv.size());
  for (size_t j = 0; j < inv.size(); ++j) out[j] = 1.0f / inv[j];
  return out;
}

/// Captures up to `max_rows` rows of each smoothable linear input of every layer.
class ActivationCapture final : public ActivationObserver {
 public:
  ActivationCapture(int n_layers, int64_t stride) : stride_(stride), rows_(size_t(n_layers) * kActivationSites) {}
  void on_linear_input(int layer, ActivationSite site, const float* x, int64_t n, int64_t width) override {
    auto& r = rows_[size_t(layer) * kActivationSites + size_t(site)];
    for (int64_t t = 0; t < n; t += stride_) r.data.insert(r.data.end(), x + t * width, x + (t + 1) * width);
    r.width = width;
  }
  struct Rows {
    std::vector<float> data;  ///< [rows, width]
    int64_t width = 0;
    int64_t count() const { return width ? static_cast<int64_t>(data.size()) / width : 0; }
  };
  const Rows& get(int layer, ActivationSite site) const { return rows_[size_t(layer) * kActivationSites + size_t(site)]; }

 private:
  int64_t stride_;
  std::vector<Rows> rows_;
};

/// Static activation step of a site: Δ = (smoothed) calibrated absmax / 127.
float static_step(const ModelConfig& c, const LayerStats& st, ActivationSite site, const std::vector<float>* factors) {
  const ChannelStats& cs = st.inputs[size_t(site)];
  float m = cs.tensor_absmax;
  if (factors) {
    const auto sm = smoothed_absmax(c, site, cs.absmax, *factors);
    m = *std::max_element(sm.begin(), sm.end());
  }
  return int8_step(m);
}

/// Output MSE of the site's linears, FP32 vs W8A8 (real INT8 path), after smoothing with `s`.
double group_mse(const Checkpoint& layer_ck, int layer, ActivationSite site, const std::vector<float>* s,
                 const ActivationCapture::Rows& X, const LayerStats& st, const ConvertOptions& o) {
  Checkpoint ck = layer_ck;
  std::vector<float> xs = X.data;
  if (s) {
    apply_smoothing(ck, layer, site, *s);
    const auto e = expand_factors(ck.config, site, *s);
    for (int64_t r = 0; r < X.count(); ++r)
      for (int64_t j = 0; j < X.width; ++j) xs[size_t(r * X.width + j)] /= e[size_t(j)];
  }
  const float step = o.act == ActQuant::PerTensorStatic ? static_step(ck.config, st, site, s) : 0.0f;
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

void write_linear(SqmWriter& w, const Checkpoint& ck, const std::string& base, const ConvertOptions& o, float step) {
  const Tensor& W = ck.tensors.at(base + ".weight");
  const int64_t out = W.dim(0), in = W.dim(1);
  std::vector<int8_t> q(size_t(out * in));
  std::vector<float> scales(o.weight == WeightGranularity::PerChannel ? size_t(out) : 1);
  quantize_weight(W.data(), out, in, o.weight, q.data(), scales.data());
  w.add_tensor(base + ".weight", SqmDType::I8, {out, in}, q.data(), q.size());
  w.add_tensor(base + ".weight_scale", SqmDType::F32, {int64_t(scales.size())}, scales.data(), scales.size() * 4);
  if (o.act == ActQuant::PerTensorStatic) w.add_tensor(base + ".input_scale", SqmDType::F32, {1}, &step, 4);
  if (ck.has(base + ".bias")) write_float(w, base + ".bias", ck.tensors.at(base + ".bias"), ConvertScheme::F32);
}

/// Writes one W4A16 projection: weight I4x2 (symmetric) / U4x2 (asymmetric) [out, in], weight_scale
/// F16 [out, ⌈in/g⌉], and (asymmetric) weight_zero U4x2 [out, ⌈in/g⌉] (docs/formats.md).
void write_int4_linear(SqmWriter& w, const Int4Projection& p) {
  const Int4Weights& q = p.weights;
  const int64_t ng = int4_groups_per_row(q);
  w.add_tensor(p.name + ".weight", q.asym ? SqmDType::U4x2 : SqmDType::I4x2, {q.out, q.in}, q.packed.data(), q.packed.size());
  w.add_tensor(p.name + ".weight_scale", SqmDType::F16, {q.out, ng}, q.scales_f16.data(), q.scales_f16.size() * 2);
  if (q.asym) w.add_tensor(p.name + ".weight_zero", SqmDType::U4x2, {q.out, ng}, q.zeros_packed.data(), q.zeros_packed.size());
}

/// Packs INT4 codes (one per byte, [−8, 7]) two per byte over the flat element order (I4x2).
std::vector<uint8_t> pack_i4x2(const std::vector<int8_t>& codes) {
  std::vector<uint8_t> b((codes.size() + 1) / 2, 0);
  for (size_t i = 0; i < codes.size(); ++i) {
    const uint8_t nib = static_cast<uint8_t>(codes[i] & 0xF);
    b[i / 2] |= static_cast<uint8_t>((i & 1) ? nib << 4 : nib);
  }
  return b;
}

/// Writes one W4A4 (Atom) projection (docs/formats.md): weight I4x2 [out, in − n], weight_scale F16
/// [out, G], weight_outlier I8 [out, n] + weight_outlier_scale F32 [out] (INT8 outliers) or
/// weight_outlier F32 [out, n] (FP32 outliers), act_clip F32 [1].
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
}

/// Every k-th row of each linear input of one layer (Atom --clip search).
class SiteCapture final : public ActivationObserver {
 public:
  SiteCapture(int layer, int64_t stride) : layer_(layer), stride_(stride) {}
  void on_linear_input(int layer, ActivationSite site, const float* x, int64_t n, int64_t width) override {
    if (layer != layer_) return;
    SiteRows& r = rows[size_t(site)];
    r.width = width;
    for (int64_t t = 0; t < n; t += stride_) r.data.insert(r.data.end(), x + t * width, x + (t + 1) * width);
  }
  std::array<SiteRows, kActivationSites> rows;

 private:
  int layer_;
  int64_t stride_;
};

/// Rows per site captured for --clip search (every k-th calibration token).
constexpr int64_t kAtomClipRows = 2048;

}  // namespace

ConvertSummary convert_model(const LoadedModel& src, const ConvertOptions& o, const std::string& out_path) {
  src.checkpoint.config.require_llama_structure(src.path + ": sq-convert");
  const Checkpoint& base = src.checkpoint;
  if (base.tensors.empty()) throw UsageError(src.path + ": convert from the original checkpoint, not a " + src.format + " file");
  const ModelConfig& c = base.config;
  const bool w8a8 = o.scheme == ConvertScheme::W8A8;
  const bool w4 = o.scheme == ConvertScheme::W4A16;
  const bool atom = o.scheme == ConvertScheme::W4A4Atom;
  if (w4 && c.qkv_bias) throw UnsupportedError(src.path + ": --scheme w4a16 does not support q/k/v biases yet");
  bool atom_outliers = false;
  if (atom) {
    if (c.qkv_bias) throw UnsupportedError(src.path + ": --scheme w4a4-atom does not support q/k/v biases yet");
    validate_atom_options(o.atom);
    for (int64_t width : {int64_t(c.dim), int64_t(c.n_heads) * c.head_dim, int64_t(c.hidden_dim)})
      atom_outliers |= atom_outlier_count(width, o.atom.outlier_channels) > 0;  // UsageError for a count ≥ a width
    if (atom_outliers && o.calib_path.empty())
      throw UsageError("--scheme w4a4-atom picks outlier channels from calibration statistics: give --calib (or --outlier-channels 0)");
    if (o.atom.gptq && o.calib_path.empty()) throw UsageError("--gptq needs --calib (a calibration file from sq-calibrate, for the Hessians)");
    if (o.atom.clip == "search" && o.calib_path.empty())
      throw UsageError("--clip search needs --calib (its text, seed and windows give the calibration activations)");
  }
  if (w4 && o.int4.gptq && o.calib_path.empty())
    throw UsageError("--gptq needs --calib (a calibration file from sq-calibrate, for the Hessians)");
  if (o.gptq_hessians != "auto" && o.gptq_hessians != "sequential" && o.gptq_hessians != "file")
    throw UsageError("--gptq-hessians must be auto, sequential or file, got '" + o.gptq_hessians + "'");
  if (!(o.alpha >= 0.0f && o.alpha <= 1.0f)) throw UsageError("--alpha must be in [0, 1] or 'auto', got " + std::to_string(o.alpha));
  const bool needs_calib = w8a8 && (o.smooth || o.act == ActQuant::PerTensorStatic);
  if (needs_calib && o.calib_path.empty())
    throw UsageError(std::string("--calib is required for ") + (o.smooth ? "SmoothQuant smoothing" : "static (O3) activation scales") +
                     " (run sq-calibrate first)");
  if (w8a8 && o.quantize_head && o.act == ActQuant::PerTensorStatic)
    throw UsageError("--quantize-head needs a dynamic activation mode (the LM head input has no calibrated static scale)");

  CalibrationData calib;
  if (!o.calib_path.empty()) {
    calib = read_calibration_h5(o.calib_path);
    const std::string fp = model_fingerprint(base);
    if (calib.provenance.model_fingerprint != fp)
      throw InputError(o.calib_path + " was recorded for another model (fingerprint " + calib.provenance.model_fingerprint.substr(0, 12) +
                       "…, this model " + fp.substr(0, 12) + "…)");
    if (static_cast<int>(calib.layers.size()) != c.n_layers)
      throw InputError(o.calib_path + ": " + std::to_string(calib.layers.size()) + " layers, the model has " + std::to_string(c.n_layers));
  }

  // The calibration text, when something re-reads it: --calib-text or the recorded path, verified
  // against the recorded SHA-256 (calib/calibration_text.h), so the choice never depends on the cwd.
  const bool gptq = (w4 && o.int4.gptq) || (atom && o.atom.gptq);
  const bool clip_search = atom && o.atom.clip == "search";
  const bool alpha_search = w8a8 && o.smooth && o.alpha_auto;
  // A calibration on token ids (sq-calibrate --token-ids) re-draws its windows from the ids, without a tokenizer.
  const bool ids_calib = calib.provenance.text_format == kTextFormatTokenIds;
  const bool can_redraw = ids_calib || !o.tokenizer_path.empty();
  std::string hessian_mode = o.gptq_hessians;  // auto: sequential whenever the windows can be re-drawn
  if (hessian_mode == "auto") hessian_mode = can_redraw ? "sequential" : "file";
  const bool sequential_gptq = gptq && hessian_mode == "sequential";
  if (!o.calib_text.empty() && o.calib_path.empty()) throw UsageError("--calib-text needs --calib (the calibration file it belongs to)");
  if (!o.calib_text.empty() && !alpha_search && !sequential_gptq && !clip_search)
    throw UsageError("--calib-text has no effect here: only --alpha auto, --gptq with sequential Hessians and --clip search re-read the "
                     "calibration text");
  ResolvedCalibrationText text;
  auto calibration_text = [&](const std::string& purpose, const std::string& alternative) {
    if (text.path.empty()) text = resolve_calibration_text(calib.provenance, o.calib_path, o.calib_text, purpose, alternative);
    return text.path;
  };
  // The calibration windows again (n of them, the calibration's seq_len and seed) from the file found.
  auto redraw_windows = [&](const std::string& path, int64_t n) {
    const CalibrationProvenance& pv = calib.provenance;
    if (ids_calib) return sample_token_id_windows(read_token_ids_file(path, c.vocab_size), path, n, pv.seq_len, pv.seed);
    auto tok = load_tokenizer(o.tokenizer_path);
    return sample_calibration_windows(path, *tok, n, pv.seq_len, pv.seed);
  };

  // --alpha auto: activations of the FP32 model on calibration windows (smoothing earlier layers
  // does not change the function, so these are also the inputs of the smoothed model).
  std::unique_ptr<ActivationCapture> capture;
  if (alpha_search) {
    if (!can_redraw) throw UsageError("--alpha auto needs the tokenizer (give --tokenizer)");
    const std::string path = calibration_text("--alpha auto", "");
    const auto windows = redraw_windows(path, o.alpha_windows);
    const int64_t total_rows = o.alpha_windows * calib.provenance.seq_len;
    const int64_t stride = std::max<int64_t>(1, (total_rows + o.alpha_max_rows - 1) / o.alpha_max_rows);
    capture = std::make_unique<ActivationCapture>(c.n_layers, stride);
    for (const auto& w : windows) {
      KVCache cache(c, static_cast<int64_t>(w.size()));
      Workspace ws;
      src.model->forward(w.data(), static_cast<int64_t>(w.size()), cache, ws, nullptr, LogitsFor::None, capture.get());
    }
  }

  // W4A16 GPTQ: Hessians layer by layer on the outputs of the already-quantized layers, or the
  // FP32-model Hessians stored in the calibration file.
  const bool keep_f32 = w8a8 || w4 || atom;
  std::unique_ptr<LayerwiseRunner> sequential;
  ConvertSummary summary;
  if (gptq || clip_search) {
    const std::string mode = hessian_mode;
    if (clip_search && !can_redraw) throw UsageError("--clip search needs the tokenizer (give --tokenizer)");
    if (mode == "sequential" || clip_search) {
      if (!can_redraw) throw UsageError("--gptq-hessians sequential needs the tokenizer (give --tokenizer)");
      const std::string path =
          clip_search ? calibration_text("--clip search", "")
                      : calibration_text(o.gptq_hessians == "auto" ? "--gptq (sequential Hessians, the --gptq-hessians auto default)"
                                                                   : "--gptq-hessians sequential",
                                         "or use the Hessians stored by sq-calibrate --hessian: --gptq-hessians file");
      const auto windows = redraw_windows(path, calib.provenance.samples);
      sequential = std::make_unique<LayerwiseRunner>(*src.model, windows);
    }
    if (gptq && mode == "file") {
      for (size_t l = 0; l < calib.layers.size(); ++l)
        if (calib.layers[l].hessians.size() != size_t(kActivationSites))
          throw InputError(o.calib_path + ": no GPTQ Hessians for layer " + std::to_string(l) +
                           " (record them with sq-calibrate --hessian, or let sq-convert recompute them from the calibration text)");
    }
    if (gptq) summary.hessian_source = mode;
  }
  const bool sequential_h = gptq && summary.hessian_source == "sequential";

  SqmWriter out(out_path, o.write);
  if (w8a8 && o.quantize_head) {
    // INT8 embedding rows with per-row scales (per-channel of the tied head). Weight granularity
    // is per-channel regardless of --weight: one outlier token must not coarsen every row.
    ConvertOptions rows = o;
    rows.weight = WeightGranularity::PerChannel;
    rows.act = ActQuant::PerToken;  // no input_scale tensor for the embedding
    Checkpoint emb;
    emb.tensors["model.embed_tokens.weight"] = base.tensors.at(names::kEmbed);
    write_linear(out, emb, "model.embed_tokens", rows, 0.0f);
  } else {
    write_float(out, names::kEmbed, base.tensors.at(names::kEmbed), keep_f32 ? ConvertScheme::F32 : o.scheme);
  }
  const char* linear_suffixes[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                   "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  nlohmann::json alphas = nlohmann::json::array();
  std::array<std::vector<double>, kActivationSites> held_hessians;  // W4A16 sequential: this layer's
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = names::layer(l);
    Checkpoint layer;  // this layer's tensors only: smoothing clones what it touches, freed after the layer
    layer.config = c;
    layer.source = base.source;
    for (const auto& [name, t] : base.tensors)
      if (name.rfind(p, 0) == 0) layer.tensors[name] = t;
    std::map<ActivationSite, std::vector<float>> factors;
    if (w8a8 && o.smooth) {
      SmoothingOptions so{o.alpha, {o.smooth_vo, false}, {}};
      if (capture)  // --alpha auto: α per mapping minimizing the W8A8 output MSE on the captured rows
        so.alpha_objective = [&](const Checkpoint& original, const SmoothingMapping& m, const std::vector<float>& s) {
          return group_mse(original, l, m.site, &s, capture->get(l, m.site), calib.layers[size_t(l)], o);
        };
      for (SmoothingGroup& g : smooth_layer(layer, l, calib.layers[size_t(l)], so)) {
        factors[g.site] = g.factors;
        alphas.push_back({{"layer", l}, {"site", activation_site_name(g.site)}, {"alpha", g.alpha}});
        summary.groups.push_back(std::move(g));
      }
    }
    write_float(out, p + "input_layernorm.weight", layer.tensors.at(p + "input_layernorm.weight"), keep_f32 ? ConvertScheme::F32 : o.scheme);
    write_float(out, p + "post_attention_layernorm.weight", layer.tensors.at(p + "post_attention_layernorm.weight"),
                keep_f32 ? ConvertScheme::F32 : o.scheme);
    if (atom) {
      std::array<const std::vector<double>*, kActivationSites> H{};
      std::unique_ptr<LayerHessians> layer_h;
      const DecoderLayer& f = src.model->layers()[size_t(l)];
      if (sequential_h) {
        layer_h = std::make_unique<LayerHessians>(sequential->hessians(l, f));
        for (int s = 0; s < kActivationSites; ++s) {
          const auto& acc = layer_h->at(static_cast<ActivationSite>(s));
          if (acc.tokens() > 0) held_hessians[size_t(s)] = acc.hessian();
          H[size_t(s)] = &held_hessians[size_t(s)];
        }
      } else if (gptq) {
        for (int s = 0; s < kActivationSites; ++s) H[size_t(s)] = &calib.layers[size_t(l)].hessians[size_t(s)];
      }
      std::unique_ptr<SiteCapture> capture_rows;
      std::array<const SiteRows*, kActivationSites> rows{};
      if (clip_search) {
        capture_rows = std::make_unique<SiteCapture>(l, std::max<int64_t>(1, (sequential->tokens() + kAtomClipRows - 1) / kAtomClipRows));
        sequential->observe(l, f, *capture_rows);
        for (int s = 0; s < kActivationSites; ++s) rows[size_t(s)] = &capture_rows->rows[size_t(s)];
      }
      AtomLayer al = quantize_layer_atom(layer, l, o.atom, calib.layers.empty() ? nullptr : &calib.layers[size_t(l)], H, rows);
      for (ActivationSite site : {ActivationSite::AttnInput, ActivationSite::AttnOutput, ActivationSite::FfnInput}) {
        const auto& ord = al.orders[size_t(site)];
        if (!ord.empty())
          out.add_tensor(p + activation_site_name(site) + ".order", SqmDType::I32, {int64_t(ord.size())}, ord.data(), ord.size() * 4);
      }
      for (size_t k = 0; k < al.linears.size(); ++k) {
        write_atom_linear(out, al.linears[k].first, al.linears[k].second);
        const ActivationSite site = projection_input_site(static_cast<Projection>(k));
        summary.atom.push_back({al.linears[k].first, al.n_outlier[size_t(site)], al.clips[k], al.hessian_errors[k]});
      }
      if (sequential) {  // the converted layer produces the next layer's inputs
        DecoderLayer q;
        q.attn_norm = f.attn_norm;
        q.ffn_norm = f.ffn_norm;
        std::unique_ptr<Linear>* slots[kProjections] = {&q.q_proj, &q.k_proj, &q.v_proj, &q.o_proj, &q.gate_proj, &q.up_proj, &q.down_proj};
        for (int k = 0; k < kProjections; ++k) *slots[k] = std::make_unique<W4A4Linear>(al.linears[size_t(k)].second);
        sequential->advance(l, q);
      }
      if (o.progress) o.progress(l + 1, c.n_layers);
      continue;
    }
    if (w4) {
      std::array<const std::vector<double>*, kActivationSites> H{};
      std::unique_ptr<LayerHessians> layer_h;
      if (sequential) {
        layer_h = std::make_unique<LayerHessians>(sequential->hessians(l, src.model->layers()[size_t(l)]));
        for (int s = 0; s < kActivationSites; ++s) {
          const auto& acc = layer_h->at(static_cast<ActivationSite>(s));
          if (acc.tokens() > 0) held_hessians[size_t(s)] = acc.hessian();
          H[size_t(s)] = &held_hessians[size_t(s)];
        }
      } else if (!calib.layers.empty() && calib.layers[size_t(l)].hessians.size() == size_t(kActivationSites)) {
        for (int s = 0; s < kActivationSites; ++s) H[size_t(s)] = &calib.layers[size_t(l)].hessians[size_t(s)];
      }
      auto projections = quantize_layer_int4(layer, l, o.int4, H);
      for (const auto& proj : projections) write_int4_linear(out, proj);
      if (sequential) {  // the quantized layer produces the next layer's inputs
        const DecoderLayer& f = src.model->layers()[size_t(l)];
        DecoderLayer q;
        q.attn_norm = f.attn_norm;
        q.ffn_norm = f.ffn_norm;
        std::unique_ptr<Linear>* slots[kProjections] = {&q.q_proj, &q.k_proj, &q.v_proj, &q.o_proj, &q.gate_proj, &q.up_proj, &q.down_proj};
        for (int k = 0; k < kProjections; ++k) *slots[k] = std::make_unique<W4A16Linear>(projections[size_t(k)].weights);
        sequential->advance(l, q);
      }
      for (auto& proj : projections) summary.int4.push_back(std::move(proj));
      if (o.progress) o.progress(l + 1, c.n_layers);
      continue;
    }
    for (int k = 0; k < kProjections; ++k) {
      const std::string name = p + linear_suffixes[k];
      if (!w8a8) {
        write_float(out, name + ".weight", layer.tensors.at(name + ".weight"), o.scheme);
        if (layer.has(name + ".bias")) write_float(out, name + ".bias", layer.tensors.at(name + ".bias"), o.scheme);
        continue;
      }
      const ActivationSite site = projection_input_site(static_cast<Projection>(k));
      float step = 0.0f;
      if (o.act == ActQuant::PerTensorStatic) {
        auto it = factors.find(site);
        step = static_step(c, calib.layers[size_t(l)], site, it == factors.end() ? nullptr : &it->second);
      }
      write_linear(out, layer, name, o, step);
    }
    if (o.progress) o.progress(l + 1, c.n_layers);
  }
  write_float(out, names::kFinalNorm, base.tensors.at(names::kFinalNorm), keep_f32 ? ConvertScheme::F32 : o.scheme);
  if (w8a8 && o.quantize_head && !c.tied_embeddings) {
    Checkpoint head;
    head.tensors["lm_head.weight"] = base.tensors.at(names::kLmHead);
    write_linear(out, head, "lm_head", o, 0.0f);
  } else if (!c.tied_embeddings && !(w8a8 && o.quantize_head)) {
    write_float(out, names::kLmHead, base.tensors.at(names::kLmHead), keep_f32 ? ConvertScheme::F32 : o.scheme);
  }

  nlohmann::json header;
  header["producer"] = std::string("sqkit ") + SQ_VERSION + " sq-convert";
  header["model_config"] = model_config_to_json(c);
  header["source"] = {{"format", src.format}, {"fingerprint", model_fingerprint(base)}};
  if (!o.tokenizer_path.empty()) {
    // The tokenizer's own file verbatim, or for a GGUF model a metadata-only GGUF of its
    // tokenizer.* keys (formats/gguf_tokenizer.h); load_tokenizer_from_bytes reads any of them back.
    std::string format;
    const std::string bytes = tokenizer_bytes_for_embedding(o.tokenizer_path, &format);
    const std::string tname = format == "sentencepiece" ? "tokenizer.model"
                              : format == "llama2c"     ? "tokenizer.bin"
                              : format == "hf-json"     ? "tokenizer.json"
                                                        : "tokenizer.gguf";
    out.add_tensor(tname, SqmDType::U8, {int64_t(bytes.size())}, bytes.data(), bytes.size());
    header["tokenizer"] = {{"format", format}, {"tensor", tname}};
  }
  nlohmann::json q = {{"scheme", scheme_name(o.scheme)}};
  if (w8a8) {
    q["weight"] = to_string(o.weight);
    q["act"] = to_string(o.act);
    q["preset"] = o.preset;
    q["quantize_head"] = o.quantize_head;
    q["smoothing"] = {{"enabled", o.smooth},
                      {"alpha", o.smooth ? (o.alpha_auto ? nlohmann::json("auto") : nlohmann::json(o.alpha)) : nlohmann::json(nullptr)},
                      {"smooth_vo", o.smooth_vo},
                      {"groups", alphas}};
  }
  if (w4) {
    q["group_size"] = o.int4.group_size;
    q["symmetric"] = !o.int4.asym;
    q["method"] = o.int4.gptq ? "gptq" : "rtn";
    if (o.int4.gptq) {
      q["gptq"] = {{"act_order", o.int4.act_order}, {"damp", o.int4.damp}, {"static_groups", o.int4.act_order}, {"hessians", summary.hessian_source}};
    }
  }
  if (atom) {
    const auto& a = o.atom;
    q["group_size"] = a.group_size;
    q["symmetric"] = true;
    q["method"] = a.gptq ? "gptq" : "rtn";
    q["outlier_channels"] = a.outlier_channels < 0 ? nlohmann::json("auto") : nlohmann::json(a.outlier_channels);
    q["outlier_format"] = to_string(a.outlier_format);
    q["outlier_selection"] = "largest calibration sum of squares per linear input";
    nlohmann::json counts = nlohmann::json::object();
    for (int s = 0; s < kActivationSites; ++s) {
      const int64_t widths[kActivationSites] = {c.dim, int64_t(c.n_heads) * c.head_dim, c.dim, c.hidden_dim};
      counts[activation_site_name(static_cast<ActivationSite>(s))] = atom_outlier_count(widths[s], a.outlier_channels);
    }
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
  }
  header["quantization"] = q;
  if (o.kv.spec.quantized()) {
    header["kv_cache"] = kv_spec_to_json(o.kv.spec);
    for (size_t l = 0; l < o.kv.params.size(); ++l) {
      const NuqLayerParams& p = o.kv.params[l];
      const int li = static_cast<int>(l);
      auto f32 = [&](const char* what, const std::vector<float>& v) {
        if (!v.empty()) out.add_tensor(kv_tensor_name(li, what), SqmDType::F32, {int64_t(v.size())}, v.data(), v.size() * 4);
      };
      f32("key_codebook", p.key_codebook);
      f32("value_codebook", p.value_codebook);
      f32("key_offset", p.key_offset);
      f32("key_scale", p.key_scale);
    }
  }
  if (!o.calib_path.empty()) {
    const auto& pv = calib.provenance;
    header["calibration"] = {{"file_sha256", sha256_file_hex(o.calib_path)}, {"model_fingerprint", pv.model_fingerprint},
                             {"text", text.path.empty() ? pv.text_path : text.path}, {"text_sha256", pv.text_sha256}, {"samples", pv.samples},
                             {"seq_len", pv.seq_len}, {"seed", pv.seed}, {"sqkit_version", pv.sqkit_version}};
  }
  out.finish(header);
  summary.file_bytes = out.bytes_written();
  return summary;
}

}  // namespace sq
