// Recipe step "calibration data per layer": GPTQ Hessians and calibration rows of each linear-input
// site, sequential (layer by layer through the already-converted layers) or from the calibration file.
#include "calib/layerwise_runner.h"
#include "calib/recipe.h"
#include "core/error.h"
#include "formats/calibration_h5.h"

namespace sq {

namespace {
/// Every k-th row of each linear input of one layer.
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
}  // namespace

LayerInputs::LayerInputs(ConvertInputs& in, bool sequential, const std::string& text_purpose, const std::string& text_alternative) {
  if (!sequential) return;
  const std::string& path = in.calibration_text(text_purpose, text_alternative);
  const auto windows = in.redraw_windows(path, in.calib.provenance.samples);
  runner_ = std::make_unique<LayerwiseRunner>(*in.src.model, windows);
}

std::array<const std::vector<double>*, kActivationSites> LayerInputs::sequential_hessians(int l, const DecoderLayer& fp32) {
  std::array<const std::vector<double>*, kActivationSites> H{};
  for (auto& h : held_) std::vector<double>().swap(h);  // the previous layer's, before this layer's are accumulated
  LayerHessians h = runner_->hessians(l, fp32);
  for (int s = 0; s < kActivationSites; ++s) {
    auto& acc = h.at(static_cast<ActivationSite>(s));
    // A site no token reached (e.g. an MoE layer whose experts saw nothing) stays empty: null below.
    if (acc.tokens() > 0) held_[size_t(s)] = acc.take_hessian();  // in place: no second copy
    H[size_t(s)] = held_[size_t(s)].empty() ? nullptr : &held_[size_t(s)];
  }
  return H;
}

std::array<SiteRows, kActivationSites> LayerInputs::rows(int l, const DecoderLayer& fp32, int64_t max_rows) const {
  SiteCapture capture(l, std::max<int64_t>(1, (runner_->tokens() + max_rows - 1) / max_rows));
  runner_->observe(l, fp32, capture);
  return std::move(capture.rows);
}

void LayerInputs::advance(int l, const DecoderLayer& converted) {
  if (runner_) runner_->advance(l, converted);
}

std::array<const std::vector<double>*, kActivationSites> ConvertInputs::file_hessians(int l) {
  std::array<const std::vector<double>*, kActivationSites> H{};
  if (calib.layers.empty()) return H;
  LayerStats& st = calib.layers[size_t(l)];
  if (st.hessians.size() != size_t(kActivationSites)) return H;  // none recorded
  if (file_hessian_layer_ != l) {  // recorded, not read yet (CalibrationHessians::Defer): one layer at a time
    if (file_hessian_layer_ >= 0)
      for (auto& h : calib.layers[size_t(file_hessian_layer_)].hessians) std::vector<double>().swap(h);
    st.hessians = read_calibration_hessians(o.calib_path, l, st);
    file_hessian_layer_ = l;
  }
  for (int s = 0; s < kActivationSites; ++s) H[size_t(s)] = st.hessians[size_t(s)].empty() ? nullptr : &st.hessians[size_t(s)];
  return H;
}

void ConvertInputs::release_file_hessian(int l, ActivationSite site) {
  if (calib.layers.empty()) return;
  auto& hs = calib.layers[size_t(l)].hessians;
  if (hs.size() == size_t(kActivationSites)) std::vector<double>().swap(hs[size_t(site)]);
}

void LayerInputs::release_hessian(ActivationSite site) { std::vector<double>().swap(held_[size_t(site)]); }

std::unique_ptr<LayerInputs> prepare_gptq_hessians(ConvertInputs& in, ConvertSummary& summary) {
  summary.hessian_source = in.hessian_mode;
  if (in.hessian_mode == "sequential") {
    if (!in.can_redraw) throw UsageError("--gptq-hessians sequential needs the tokenizer (give --tokenizer)");
    return std::make_unique<LayerInputs>(in, true,
                                         in.o.gptq_hessians == "auto" ? "--gptq (sequential Hessians, the --gptq-hessians auto default)"
                                                                      : "--gptq-hessians sequential",
                                         "or use the Hessians stored by sq-calibrate --hessian: --gptq-hessians file");
  }
  if (const int64_t l = first_layer_without_hessians(in); l >= 0)
    throw InputError(in.o.calib_path + ": no GPTQ Hessians for layer " + std::to_string(l) +
                     " (record them with sq-calibrate --hessian, or let sq-convert recompute them from the calibration text)");
  return nullptr;
}

int64_t first_layer_without_hessians(const ConvertInputs& in) {
  for (size_t l = 0; l < in.calib.layers.size(); ++l)
    if (in.calib.layers[l].hessians.size() != size_t(kActivationSites)) return int64_t(l);
  return -1;
}

}  // namespace sq
