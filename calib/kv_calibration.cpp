#include "calib/kv_calibration.h"

#include <algorithm>
#include <cmath>

#include "calib/weighted_kmeans.h"
#include "core/error.h"
#include "core/rope_frequencies.h"
#include "formats/calibration_h5.h"
#include "formats/fingerprint.h"
#include "ops/ops.h"
#include "quant/codebook_quantize.h"

namespace sq {

namespace {

/// Normalized values and their weights of one K or V tensor, ready for the k-means.
struct FitSet {
  std::vector<float> a, w;
  int64_t outliers = 0;
};

/// Adds x normalized with (offset, scale). Eq. 2 weighs the raw-domain error F·(x − Q(x))² =
/// F·scale²·(a − Q(a))², so the normalized value's weight is F·scale² (uniform weighting: scale²).
void add_value(FitSet& f, float x, float offset, float scale, float fisher, bool weighted, bool sparse) {
  float a = scale > 0.0f ? (x - offset) / scale : 0.0f;
  if (std::fabs(a) > 1.0f) {
    if (sparse) {  // beyond the thresholds: a sparse FP16 outlier at run time, not in the codebook
      ++f.outliers;
      return;
    }
    a = std::clamp(a, -1.0f, 1.0f);  // as the runner clamps (e.g. FP16-rounded scales at the extremes)
  }
  f.a.push_back(a);
  f.w.push_back((weighted ? fisher : 1.0f) * scale * scale);
}

std::vector<float> fit_codebook(FitSet& f, int bits, bool qnorm, double* cost, const std::string& what) {
  if (f.a.empty()) throw InputError(what + ": no calibration values left to fit a codebook");
  std::vector<float> cb;
  try {
    cb = fit_nuq_codebook(f.a, f.w, bits);
  } catch (const std::invalid_argument& e) {
    throw InputError(what + ": " + e.what());
  }
  const CodebookQuantizer q(cb, bits);
  double c = 0, m1 = 0, m2 = 0, s1 = 0, s2 = 0;
  const double n = static_cast<double>(f.a.size());
  for (size_t i = 0; i < f.a.size(); ++i) {
    const double a = f.a[i], qa = cb[q.encode(f.a[i])];
    c += double(f.w[i]) * (a - qa) * (a - qa);
    m1 += a;
    m2 += qa;
    s1 += a * a;
    s2 += qa * qa;
  }
  if (cost) *cost = c;
  if (qnorm) {
    // Q-Norm (Eq. 3): match the dequantized distribution's mean and standard deviation.
    m1 /= n;
    m2 /= n;
    const double sd1 = std::sqrt(std::max(0.0, s1 / n - m1 * m1)), sd2 = std::sqrt(std::max(0.0, s2 / n - m2 * m2));
    if (sd2 > 0)
      for (float& x : cb) x = static_cast<float>((x - m2) * sd1 / sd2 + m1);
  }
  return cb;
}

}  // namespace

NuqLayerParams fit_nuq_layer(const KVSpec& spec, const KVFisherSamples& s, const ModelConfig& c, int layer,
                             NuqFitReport* report, bool fisher_weighted) {
  const int64_t width = s.width, T = s.tokens;
  const std::string what = "layer " + std::to_string(layer) + " KV Fisher data";
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < T; ++r)
    if (s.positions[size_t(r)] >= spec.sink_fp16) rows.push_back(r);
  if (rows.empty()) throw InputError(what + ": no rows after excluding the first " + std::to_string(spec.sink_fp16) + " tokens");
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<float> keys(static_cast<size_t>(n * width));
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(s.keys.begin() + rows[size_t(i)] * width, width, keys.begin() + i * width);
    pos[size_t(i)] = s.positions[size_t(rows[size_t(i)])];
  }
  if (spec.keys == KVKeyRope::PostRope)
    if (c.spec.position == PositionKind::Rope)
      ops::rope(keys.data(), pos.data(), n, c.n_kv_heads, c.head_dim, c.rope_dim(), rope_inv_freq(c, layer).data(), c.rope_layout);

  NuqLayerParams p;
  FitSet kf, vf;
  const bool sparse = spec.outlier_fraction > 0;
  if (spec.key_axis == KVKeyAxis::PerChannel) {
    p.key_offset.resize(static_cast<size_t>(width));
    p.key_scale.resize(static_cast<size_t>(width));
    std::vector<float> col(static_cast<size_t>(n));
    for (int64_t ch = 0; ch < width; ++ch) {
      for (int64_t i = 0; i < n; ++i) col[size_t(i)] = keys[size_t(i * width + ch)];
      float lo, hi;
      if (spec.outlier_fraction > 0) {
        lo = kv_percentile(col.data(), n, spec.outlier_fraction / 2);
        hi = kv_percentile(col.data(), n, 1.0 - spec.outlier_fraction / 2);
      } else {
        const auto mm = std::minmax_element(col.begin(), col.end());
        lo = *mm.first;
        hi = *mm.second;
      }
      p.key_offset[size_t(ch)] = 0.5f * (hi + lo);
      p.key_scale[size_t(ch)] = 0.5f * (hi - lo);
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = 0; ch < width; ++ch)
        add_value(kf, keys[size_t(i * width + ch)], p.key_offset[size_t(ch)], p.key_scale[size_t(ch)],
                  s.keys_fisher[size_t(rows[size_t(i)] * width + ch)], fisher_weighted, sparse);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      float o, sc;
      kv_token_scaling(keys.data() + i * width, width, spec.outlier_fraction, o, sc);
      for (int64_t ch = 0; ch < width; ++ch)
        add_value(kf, keys[size_t(i * width + ch)], o, sc, s.keys_fisher[size_t(rows[size_t(i)] * width + ch)], fisher_weighted, sparse);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const float* v = s.values.data() + rows[size_t(i)] * width;
    float o, sc;
    kv_token_scaling(v, width, spec.outlier_fraction, o, sc);
    for (int64_t ch = 0; ch < width; ++ch) add_value(vf, v[ch], o, sc, s.values_fisher[size_t(rows[size_t(i)] * width + ch)], fisher_weighted, sparse);
  }
  NuqFitReport rep;
  p.key_codebook = fit_codebook(kf, spec.bits, spec.qnorm, &rep.key_cost, what + " (keys)");
  p.value_codebook = fit_codebook(vf, spec.bits, spec.qnorm, &rep.value_cost, what + " (values)");
  rep.key_values = static_cast<int64_t>(kf.a.size());
  rep.value_values = static_cast<int64_t>(vf.a.size());
  rep.key_outliers = kf.outliers;
  rep.value_outliers = vf.outliers;
  if (report) *report = rep;
  return p;
}

KVQuantization fit_kv_quantization(const KVSpec& spec, const std::string& calib_path, const LoadedModel& src,
                                   std::vector<NuqFitReport>* reports, bool fisher_weighted) {
  if (spec.kind != KVKind::Nuq) return KVQuantization{spec, {}};
  if (calib_path.empty())
    throw UsageError("--kv " + kv_spec_name(spec) + " needs --calib: a calibration file from sq-calibrate --fisher");
  const CalibrationData calib = read_calibration_h5(calib_path, CalibrationHessians::Defer);
  if (!src.checkpoint.tensors.empty()) {
    const std::string fp = model_fingerprint(src.checkpoint);
    if (calib.provenance.model_fingerprint != fp)
      throw InputError(calib_path + " was recorded for another model (fingerprint " +
                       calib.provenance.model_fingerprint.substr(0, 12) + ", this model " + fp.substr(0, 12) + ")");
  }
  if (!calib.has_fisher())
    throw InputError(calib_path + ": no Fisher information (KV Fisher data); --kv " + kv_spec_name(spec) +
                     " needs a calibration file from sq-calibrate --fisher");
  const ModelConfig& c = src.model->config();
  const int64_t width = int64_t(c.n_kv_heads) * c.head_dim;
  if (static_cast<int>(calib.layers.size()) != c.n_layers || calib.layers[0].kv_fisher.width != width)
    throw InputError(calib_path + ": Fisher data has " + std::to_string(calib.layers.size()) + " layers of KV width " +
                     std::to_string(calib.layers[0].kv_fisher.width) + ", the model " + std::to_string(c.n_layers) + " of " +
                     std::to_string(width));
  KVQuantization q{spec, {}};
  q.params.resize(static_cast<size_t>(c.n_layers));
  if (reports) reports->assign(static_cast<size_t>(c.n_layers), {});
  for (int l = 0; l < c.n_layers; ++l)
    q.params[size_t(l)] = fit_nuq_layer(spec, calib.layers[size_t(l)].kv_fisher, c, l, reports ? &(*reports)[size_t(l)] : nullptr,
                                    fisher_weighted);
  return q;
}

}  // namespace sq
