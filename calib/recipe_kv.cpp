#include "calib/recipe_kv.h"

#include "calib/kv_calibration.h"
#include "core/error.h"
#include "formats/calibration_h5.h"

namespace sq {

namespace {
/// K (before RoPE) and V rows of every layer, every `stride`-th token of each window, weight 1.
class KVRowCapture final : public ActivationObserver {
 public:
  KVRowCapture(int n_layers, int64_t width, int64_t stride) : stride_(stride), samples_(static_cast<size_t>(n_layers)) {
    for (auto& s : samples_) s.width = width;
  }
  void on_kv(int layer, const float* k, const float* v, int64_t n, int64_t width) override {
    KVFisherSamples& s = samples_[size_t(layer)];
    for (int64_t t = 0; t < n; ++t) {
      if ((token_ + t) % stride_ != 0) continue;
      s.keys.insert(s.keys.end(), k + t * width, k + (t + 1) * width);
      s.values.insert(s.values.end(), v + t * width, v + (t + 1) * width);
      s.keys_fisher.insert(s.keys_fisher.end(), static_cast<size_t>(width), 1.0f);
      s.values_fisher.insert(s.values_fisher.end(), static_cast<size_t>(width), 1.0f);
      s.positions.push_back(static_cast<int32_t>(t));
      s.windows.push_back(window_);
      ++s.tokens;
    }
  }
  void next_window(int32_t w, int64_t first_token) {
    window_ = w;
    token_ = first_token;
  }
  std::vector<KVFisherSamples>& samples() { return samples_; }

 private:
  int64_t stride_;
  int32_t window_ = 0;
  int64_t token_ = 0;
  std::vector<KVFisherSamples> samples_;
};
}  // namespace

KVQuantization fit_kv_for_conversion(const KVSpec& spec, const ConvertOptions& o, const LoadedModel& src, bool fisher_weighted) {
  if (spec.kind != KVKind::Nuq || fisher_weighted || o.calib_path.empty()) return fit_kv_quantization(spec, o.calib_path, src, nullptr, fisher_weighted);
  ConvertInputs in(src, o);
  in.calib = read_calibration_h5(o.calib_path, CalibrationHessians::Defer);
  if (in.calib.has_fisher()) return fit_kv_quantization(spec, o.calib_path, src, nullptr, fisher_weighted);
  const CalibrationProvenance& pv = in.calib.provenance;
  if (pv.text_format != kTextFormatTokenIds && o.tokenizer_path.empty())
    throw UsageError("--kv " + kv_spec_name(spec) + " --kv-weighting uniform without Fisher data samples K/V from the calibration windows: "
                     "give --tokenizer (or calibrate with --fisher)");
  const auto windows = in.redraw_windows(in.calibration_text("--kv " + kv_spec_name(spec) + " (K/V rows of the calibration windows)", ""),
                                         pv.samples);
  const ModelConfig& c = src.model->config();
  int64_t total = 0;
  for (const auto& w : windows) total += static_cast<int64_t>(w.size());
  KVRowCapture capture(c.n_layers, int64_t(c.n_kv_heads) * c.head_dim, std::max<int64_t>(1, (total + kKVForwardRows - 1) / kKVForwardRows));
  int64_t first = 0;
  for (size_t i = 0; i < windows.size(); ++i) {
    const auto& w = windows[i];
    capture.next_window(static_cast<int32_t>(i), first);
    KVCache cache(c, static_cast<int64_t>(w.size()));
    Workspace ws;
    src.model->forward(w.data(), static_cast<int64_t>(w.size()), cache, ws, nullptr, LogitsFor::None, &capture);
    first += static_cast<int64_t>(w.size());
  }
  KVQuantization q{spec, {}};
  for (int l = 0; l < c.n_layers; ++l) q.params.push_back(fit_nuq_layer(spec, capture.samples()[size_t(l)], c, l, nullptr, false));
  return q;
}

void write_kv_quantization(SqmWriter& out, const KVQuantization& kv, nlohmann::json& header) {
  if (!kv.spec.quantized()) return;
  header["kv_cache"] = kv_spec_to_json(kv.spec);
  for (size_t l = 0; l < kv.params.size(); ++l) {
    const NuqLayerParams& p = kv.params[l];
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

}  // namespace sq
