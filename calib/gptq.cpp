#include "calib/gptq.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <stdexcept>

#include "core/error.h"
#include "formats/safetensors.h"
#include "ops/lapack.h"
#include "ops/library_threads.h"
#include "ops/sgemm.h"

namespace sq {
namespace {

struct QParams {
  float scale = 1.0f;
  int32_t zero = 0;
  float min = 0.0f;        ///< float minimum m (GptqOptions::grid_mins), used when has_min
  bool has_min = false;
};

void validate(int64_t out, int64_t in, const GptqOptions& o) {
  if (o.grid_scales || o.grid_mins) {
    const int64_t qc = in - o.tail_columns, g = o.group_size == 0 ? std::max<int64_t>(qc, 1) : o.group_size;
    const size_t cells = static_cast<size_t>(out * ((qc + g - 1) / g));
    if (!o.grid_scales || !o.grid_mins || o.grid_scales->size() != cells || o.grid_mins->size() != cells || !o.static_groups)
      throw std::invalid_argument("GPTQ: a fixed grid needs static_groups and both grid_scales and grid_mins of [out, groups] = " +
                                  std::to_string(cells) + " entries");
  }
  if (o.bits < 2 || o.bits > 8) throw UsageError("GPTQ/RTN: bits must be in [2, 8], got " + std::to_string(o.bits));
  if (o.group_size < 0) throw UsageError("GPTQ/RTN: group size must be ≥ 0 (0 = per channel), got " + std::to_string(o.group_size));
  if (o.block_size < 1) throw UsageError("GPTQ: block size must be ≥ 1, got " + std::to_string(o.block_size));
  if (!(o.damp >= 0) || !std::isfinite(o.damp)) throw UsageError("GPTQ: dampening must be a finite value ≥ 0");
  if (out < 0 || in < 0) throw std::invalid_argument("GPTQ/RTN: negative matrix size");
  if (!(o.clip > 0.0f && o.clip <= 1.0f)) throw UsageError("GPTQ/RTN: clipping ratio must be in (0, 1], got " + std::to_string(o.clip));
  if (o.tail_columns < 0 || (in > 0 && o.tail_columns >= in) || (in == 0 && o.tail_columns != 0))
    throw UsageError("GPTQ/RTN: tail columns must be in [0, in = " + std::to_string(in) + "), got " + std::to_string(o.tail_columns));
  if (o.scale_search && o.clip != 1.0f) throw UsageError("GPTQ/RTN: the scale search does not combine with clipping (clip " + std::to_string(o.clip) + ")");
  if (o.importance) {
    const std::string who = "GPTQ/RTN" + (o.name.empty() ? std::string() : ": " + o.name);
    if (static_cast<int64_t>(o.importance->size()) != in)
      throw UsageError(who + ": the importance vector has " + std::to_string(o.importance->size()) + " entries, expected in = " +
                       std::to_string(in));
    for (double v : *o.importance)
      if (!(v >= 0) || !std::isfinite(v)) throw UsageError(who + ": an importance entry is " + std::to_string(v) + ", expected finite and ≥ 0");
  }
}

/// Quantizer parameters of one row of one group (file comment of gptq.h).
QParams find_params(const float* w, int64_t len, int bits, bool symmetric, bool fp16, float clip) {
  const int maxq = (1 << bits) - 1;
  float lo = 0.0f, hi = 0.0f;
  for (int64_t j = 0; j < len; ++j) {
    lo = std::min(lo, w[j]);
    hi = std::max(hi, w[j]);
  }
  if (clip != 1.0f) {
    lo *= clip;
    hi *= clip;
  }
  QParams p;
  if (symmetric) {
    const float absmax = std::max(-lo, hi);
    p.zero = 1 << (bits - 1);
    p.scale = absmax > 0 ? absmax / static_cast<float>((1 << (bits - 1)) - 1) : 1.0f;
    if (fp16) p.scale = half_to_float(float_to_half(p.scale));
    if (p.scale == 0.0f) p.scale = 1.0f;  // |w| below FP16's range: every weight codes to 0
  } else {
    const float range = hi - lo;
    p.scale = range > 0 ? range / static_cast<float>(maxq) : 1.0f;
    if (fp16) p.scale = half_to_float(float_to_half(p.scale));
    if (p.scale == 0.0f) p.scale = 1.0f;
    p.zero = static_cast<int32_t>(std::clamp(std::nearbyint(-lo / p.scale), 0.0f, static_cast<float>(maxq)));
  }
  return p;
}

inline int quant_code(float w, const QParams& p, int maxq) {
  if (p.has_min) {  // w ≈ Δ·u + m, u = clamp(round((w − m)/Δ)); a zero Δ codes everything to m
    if (!(p.scale > 0.0f)) return 0;
    return static_cast<int>(std::clamp(std::nearbyint((w - p.min) / p.scale), 0.0f, static_cast<float>(maxq)));
  }
  const float q = std::nearbyint(w / p.scale) + static_cast<float>(p.zero);
  return static_cast<int>(std::clamp(q, 0.0f, static_cast<float>(maxq)));
}

inline float dequant(int code, const QParams& p) {
  return p.has_min ? p.scale * static_cast<float>(code) + p.min : p.scale * static_cast<float>(code - p.zero);
}

/// Σ_j a_j (w_j − ŵ_j)² of one group coded with p (a = null: uniform), in double.
double weighted_error(const float* w, const double* a, int64_t len, const QParams& p, int maxq) {
  double e = 0;
  for (int64_t j = 0; j < len; ++j) {
    const double d = double(w[j]) - double(dequant(quant_code(w[j], p, maxq), p));
    e += (a ? a[j] : 1.0) * d * d;
  }
  return e;
}

/// The importance-weighted scale search of gptq.h's file comment. `a` [len] (null or all zero:
/// uniform). Starts from the min/max rule's parameters, so the result's error is never larger.
QParams search_params(const float* w, const double* a, int64_t len, int bits, bool symmetric, bool fp16) {
  const int maxq = (1 << bits) - 1;
  if (a) {
    double sum = 0;
    for (int64_t j = 0; j < len; ++j) sum += a[j];
    if (!(sum > 0)) a = nullptr;
  }
  QParams best = find_params(w, len, bits, symmetric, fp16, 1.0f);
  double best_err = weighted_error(w, a, len, best, maxq);
  const auto rounded = [fp16](double d) { return fp16 ? half_to_float(float_to_half(static_cast<float>(d))) : static_cast<float>(d); };
  const auto consider = [&](const QParams& p) {
    if (!(p.scale != 0.0f) || !std::isfinite(p.scale)) return;
    const double e = weighted_error(w, a, len, p, maxq);
    if (e < best_err) {
      best_err = e;
      best = p;
    }
  };
  // One pass over the group: p's error, then the least-squares step of p's codes q = u − z with z
  // fixed, Σ a w q / Σ a q² (llama.cpp's refinement). An asymmetric step must stay > 0.
  const auto consider_refined = [&](const QParams& p) {
    double e = 0, num = 0, den = 0;
    for (int64_t j = 0; j < len; ++j) {
      const int c = quant_code(w[j], p, maxq);
      const double q = c - p.zero, aj = a ? a[j] : 1.0, d = double(w[j]) - double(dequant(c, p));
      e += aj * d * d;
      num += aj * double(w[j]) * q;
      den += aj * q * q;
    }
    if (e < best_err) {
      best_err = e;
      best = p;
    }
    if (den > 0) {
      QParams r = p;
      r.scale = rounded(num / den);
      if (symmetric || r.scale > 0.0f) consider(r);
    }
  };
  if (symmetric) {
    float m = 0.0f;  // the signed extreme
    for (int64_t j = 0; j < len; ++j)
      if (std::fabs(w[j]) > std::fabs(m)) m = w[j];
    if (m == 0.0f) return best;
    const int half = 1 << (bits - 1);
    const auto with_refinement = [&](double step) {
      QParams p;
      p.zero = half;
      p.scale = rounded(step);
      if (!(p.scale != 0.0f) || !std::isfinite(p.scale)) return;
      consider_refined(p);
    };
    for (int k = 0; k <= 20; ++k) with_refinement(-double(m) / (half - 1 + 0.1 * k));
    for (int k = 0; k <= 10; ++k) with_refinement(double(m) / (half - 1.5 + 0.1 * k));
  } else {
    // The min/max range shrunk evenly (p = 0.99 … 0.80), then each end pulled in on its own
    // (lo·(1 − 0.05 i), hi·(1 − 0.05 k), i, k = 0 … 5; z = round(−lo'/Δ) kept), each also refined.
    for (int k = 1; k <= 20; ++k) consider(find_params(w, len, bits, false, fp16, 1.0f - 0.01f * float(k)));
    float lo = 0.0f, hi = 0.0f;
    for (int64_t j = 0; j < len; ++j) {
      lo = std::min(lo, w[j]);
      hi = std::max(hi, w[j]);
    }
    for (int i = 0; i <= 5; ++i)
      for (int k = 0; k <= 5; ++k) {
        const double l = double(lo) * (1.0 - 0.05 * i), h = double(hi) * (1.0 - 0.05 * k);
        QParams p;
        p.scale = rounded((h - l) / maxq);
        if (!(p.scale > 0.0f) || !std::isfinite(p.scale)) continue;
        p.zero = static_cast<int32_t>(std::clamp(std::nearbyint(-l / p.scale), 0.0, double(maxq)));
        consider_refined(p);
      }
  }
  return best;
}

/// A group's parameters by the options' rule: the search (a: its importance, or null) or min/max.
QParams group_params(const float* w, const double* a, int64_t len, const GptqOptions& o) {
  return o.scale_search ? search_params(w, a, len, o.bits, o.symmetric, o.fp16_scales)
                        : find_params(w, len, o.bits, o.symmetric, o.fp16_scales, o.clip);
}

GptqResult empty_result(int64_t out, int64_t in, const GptqOptions& o) {
  GptqResult r;
  r.out = out;
  r.in = in;
  r.bits = o.bits;
  const int64_t qc = in - o.tail_columns;  // quantized columns
  const int64_t g = o.group_size == 0 ? std::max<int64_t>(qc, 1) : o.group_size;
  r.group_size = static_cast<int>(g);
  r.n_groups = (qc + g - 1) / g;
  r.dequantized.assign(static_cast<size_t>(out * in), 0.0f);
  r.codes.assign(static_cast<size_t>(out * in), 0);
  r.scales.assign(static_cast<size_t>(out * r.n_groups), 1.0f);
  r.zeros.assign(static_cast<size_t>(out * r.n_groups), 0);
  r.g_idx.resize(static_cast<size_t>(in));
  r.perm.resize(static_cast<size_t>(in));
  std::iota(r.perm.begin(), r.perm.end(), int64_t{0});
  for (int64_t j = 0; j < in; ++j) r.g_idx[static_cast<size_t>(j)] = j < qc ? static_cast<int32_t>(j / g) : -1;
  return r;
}

[[noreturn]] void not_pd(const GptqOptions& o, int64_t in, const std::string& detail) {
  const std::string who = o.name.empty() ? std::string("GPTQ") : "GPTQ: " + o.name;
  throw InputError(who + ": the input Hessian [" + std::to_string(in) + ", " + std::to_string(in) +
                   "] is not positive definite after dampening (damp " + std::to_string(o.damp) + "; " + detail +
                   "); increase the dampening or calibrate with more tokens");
}

}  // namespace

GptqResult rtn_quantize(const float* W, int64_t out, int64_t in, const GptqOptions& o) {
  validate(out, in, o);
  GptqResult r = empty_result(out, in, o);
  const int maxq = (1 << o.bits) - 1;
  const int64_t g = r.group_size, qc = in - o.tail_columns;
  // Rows are independent (the result does not depend on the thread count); the scale search costs
  // ~60 passes over each group, so it runs in parallel from small matrices on.
#pragma omp parallel for schedule(dynamic, 16) if (out * in >= (o.scale_search ? (int64_t(1) << 14) : (int64_t(1) << 22)))
  for (int64_t row = 0; row < out; ++row) {
    for (int64_t c = qc; c < in; ++c) r.dequantized[static_cast<size_t>(row * in + c)] = W[row * in + c];  // kept tail
    for (int64_t G = 0; G < r.n_groups; ++G) {
      const int64_t c0 = G * g, len = std::min(g, qc - c0);
      const float* w = W + row * in + c0;
      const QParams p = group_params(w, o.importance ? o.importance->data() + c0 : nullptr, len, o);
      r.scales[static_cast<size_t>(row * r.n_groups + G)] = p.scale;
      r.zeros[static_cast<size_t>(row * r.n_groups + G)] = p.zero;
      for (int64_t j = 0; j < len; ++j) {
        const int c = quant_code(w[j], p, maxq);
        r.codes[static_cast<size_t>(row * in + c0 + j)] = static_cast<uint8_t>(c);
        r.dequantized[static_cast<size_t>(row * in + c0 + j)] = dequant(c, p);
      }
    }
  }
  return r;
}

Int4Weights to_int4_weights(const GptqResult& r, bool symmetric) {
  if (r.bits != 4) throw std::invalid_argument("to_int4_weights: " + std::to_string(r.bits) + "-bit result, expected 4");
  check_int4_shape(r.out, r.in, r.group_size);
  for (int64_t j = 0; j < r.in; ++j)
    if (r.g_idx[size_t(j)] != j / r.group_size)
      throw std::invalid_argument("to_int4_weights: groups are not contiguous column ranges (act_order without static_groups)");
  Int4Weights w;
  w.out = r.out;
  w.in = r.in;
  w.group = r.group_size;
  w.asym = !symmetric;
  const int64_t ng = int4_groups_per_row(w);
  if (ng != r.n_groups) throw std::invalid_argument("to_int4_weights: group count mismatch");
  w.packed.assign(static_cast<size_t>(w.out * w.in / 2), 0);
  uint8_t* const packed = w.packed.mutable_data();
  w.scales_f16.resize(static_cast<size_t>(w.out * ng));
  std::vector<uint8_t> zeros(symmetric ? 0 : static_cast<size_t>(w.out * ng));
  for (int64_t row = 0; row < w.out; ++row) {
    for (int64_t G = 0; G < ng; ++G) {
      const size_t k = static_cast<size_t>(row * ng + G);
      const uint16_t h = float_to_half(r.scales[k]);
      if (half_to_float(h) != r.scales[k])
        throw std::invalid_argument("to_int4_weights: scale " + std::to_string(r.scales[k]) + " is not an FP16 value (use fp16_scales)");
      w.scales_f16[k] = h;
      if (symmetric && r.zeros[k] != 8) throw std::invalid_argument("to_int4_weights: symmetric zero point must be 8");
      if (!symmetric) zeros[k] = static_cast<uint8_t>(r.zeros[k]);
    }
    for (int64_t c = 0; c < w.in; ++c) {
      const int code = r.codes[static_cast<size_t>(row * w.in + c)];
      const int nib = symmetric ? ((code - 8) & 0xF) : code;
      packed[row * (w.in / 2) + c / 2] |= static_cast<uint8_t>((c & 1) ? nib << 4 : nib);
    }
  }
  if (!symmetric) {
    w.zeros_packed.assign(static_cast<size_t>((w.out * ng + 1) / 2), 0);
    for (size_t f = 0; f < zeros.size(); ++f) w.zeros_packed[f / 2] |= static_cast<uint8_t>((f & 1) ? zeros[f] << 4 : zeros[f]);
  }
  validate_int4(w);
  return w;
}

std::vector<double> hessian_diagonal(const std::vector<double>& H, int64_t in) {
  if (static_cast<int64_t>(H.size()) != in * in) throw std::invalid_argument("hessian_diagonal: H must be [in, in]");
  std::vector<double> d(static_cast<size_t>(in));
  for (int64_t i = 0; i < in; ++i) d[size_t(i)] = std::max(0.0, H[size_t(i * in + i)]);
  return d;
}

double hessian_weighted_error(const float* W, const float* W_hat, int64_t out, int64_t in, const std::vector<double>& H) {
  if (static_cast<int64_t>(H.size()) != in * in) throw std::invalid_argument("hessian_weighted_error: H must be [in, in]");
  if (out == 0 || in == 0) return 0.0;
  // Blocks of rows: memory 2·8·rows·in bytes, not 2·8·out·in (720 MB for a 4096 × 11008 down_proj).
  constexpr int64_t kRows = 256;
  const int64_t rows = std::min(out, kRows);
  std::vector<double> D(static_cast<size_t>(rows * in)), T(static_cast<size_t>(rows * in));
  double s = 0;
  for (int64_t r0 = 0; r0 < out; r0 += kRows) {
    const int64_t nr = std::min(kRows, out - r0);
    const size_t n = static_cast<size_t>(nr * in);
    for (size_t i = 0; i < n; ++i)
      D[i] = static_cast<double>(W[size_t(r0 * in) + i]) - static_cast<double>(W_hat[size_t(r0 * in) + i]);
    ops::dgemm(false, false, nr, in, in, 1.0, D.data(), in, H.data(), in, 0.0, T.data(), in);
    for (size_t i = 0; i < n; ++i) s += D[i] * T[i];
  }
  return s;
}

std::string gptq_inverse_cholesky(std::vector<double>& H, int64_t n) {
  if (n < 0 || static_cast<int64_t>(H.size()) != n * n) throw std::invalid_argument("gptq_inverse_cholesky: H must be [n, n]");
  if (n == 0) return "";
  // The upper factor U of H⁻¹ = UᵀU is the inverse of H's "upper-lower" Cholesky factor: with P the
  // order reversal, factor M = P·H·P = L·Lᵀ (L lower); then H = V·Vᵀ with V = P·L·P upper
  // triangular, H⁻¹ = V⁻ᵀ·V⁻¹, so U = V⁻¹ = P·L⁻¹·P (upper, positive diagonal: the unique such
  // factor). One Cholesky and one triangular inverse, n³/3 flops each, where inverting H first
  // (dpotrf, dpotri, dpotrf: the reference's cholesky, cholesky_inverse, cholesky) costs 4n³/3.
  const auto at = [n](int64_t i, int64_t j) { return static_cast<size_t>(i * n + j); };
  // M = P·H·P is H with both indices reversed: reversing the row-major buffer does exactly that.
  std::reverse(H.begin(), H.end());
  // M is symmetric, so the row-major buffer is also M in column-major order.
  const int ni = static_cast<int>(n);
  int info = 0;
  // One thread: OpenBLAS's threaded LAPACK gives other bits at 2 threads than at 1, so a converted
  // file would depend on -t and on the load (ops/library_threads.h).
  const ops::OneLibraryThread one;
  dpotrf_("L", &ni, H.data(), &ni, &info, 1);
  if (info > 0) return "Cholesky failed at leading minor " + std::to_string(n + 1 - info) + " (of the reversed order)";
  if (info < 0) throw std::logic_error("gptq_inverse_cholesky: dpotrf argument error");
  dtrtri_("L", "N", &ni, H.data(), &ni, &info, 1, 1);
  if (info > 0) return "the Hessian is singular";
  if (info < 0) throw std::logic_error("gptq_inverse_cholesky: dtrtri argument error");
  // Column-major lower L⁻¹ is the row-major upper triangle: buffer (j, i) = L⁻¹(i, j), i ≥ j. U(a, b)
  // = L⁻¹(n−1−a, n−1−b) for a ≤ b sits at buffer (n−1−b, n−1−a), again in the upper triangle:
  // swapping each such pair once (the map is its own inverse) leaves U in place.
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = a; b < n; ++b) {
      const int64_t r = n - 1 - b, c = n - 1 - a;  // partner of (a, b); r ≤ c
      if (r > a || (r == a && c > b)) std::swap(H[at(a, b)], H[at(r, c)]);
    }
  // The strict lower triangle: zeros (the factor is upper triangular).
  for (int64_t i = 1; i < n; ++i) std::fill_n(H.begin() + static_cast<std::ptrdiff_t>(i * n), i, 0.0);
  return "";
}

GptqResult gptq_quantize(const float* W, int64_t out, int64_t in, const std::vector<double>& H0, const GptqOptions& o) {
  validate(out, in, o);
  if (static_cast<int64_t>(H0.size()) != in * in)
    throw std::invalid_argument("gptq_quantize: H has " + std::to_string(H0.size()) + " entries, expected in·in = " +
                                std::to_string(in * in));
  GptqResult r = empty_result(out, in, o);
  if (out == 0 || in == 0) return r;
  for (double v : H0)
    if (!std::isfinite(v)) not_pd(o, in, "it has non-finite entries");
  std::vector<double> H = H0;  // the working copy (H0, the caller's, gives hessian_error)
  const int maxq = (1 << o.bits) - 1;
  const int64_t n = in, g = r.group_size, B = o.block_size, qc = in - o.tail_columns;
  const auto at = [n](int64_t i, int64_t j) { return static_cast<size_t>(i * n + j); };

  // Working copy of W (FP32, as the reference), step 1: dead columns.
  std::vector<float> Wc(W, W + out * in);
  for (int64_t i = 0; i < n; ++i)
    if (H[at(i, i)] == 0.0) {
      H[at(i, i)] = 1.0;
      for (int64_t row = 0; row < out; ++row) Wc[static_cast<size_t>(row * in + i)] = 0.0f;
    }

  // The scale search's importance: diag(H) as given (dead columns 0), original column order.
  const std::vector<double> diag = o.scale_search ? hessian_diagonal(H0, n) : std::vector<double>();

  // Static groups: every group's parameters from the (dead-column-zeroed) weights, natural order.
  std::vector<QParams> static_params;
  if (o.grid_scales) {  // a fixed float-minimum grid (K-quant): the caller's (Δ, m), natural order
    static_params.resize(static_cast<size_t>(out * r.n_groups));
    for (size_t k = 0; k < static_params.size(); ++k) {
      QParams& p = static_params[k];
      p.scale = (*o.grid_scales)[k];
      p.min = (*o.grid_mins)[k];
      p.has_min = true;
      r.scales[k] = p.scale;
      r.zeros[k] = 0;
    }
  } else if (o.static_groups) {
    static_params.resize(static_cast<size_t>(out * r.n_groups));
#pragma omp parallel for schedule(dynamic, 16) if (o.scale_search && out * in >= 4096)
    for (int64_t row = 0; row < out; ++row)
      for (int64_t G = 0; G < r.n_groups; ++G) {
        const int64_t c0 = G * g, len = std::min(g, qc - c0);
        const QParams p = group_params(Wc.data() + row * in + c0, o.scale_search ? diag.data() + c0 : nullptr, len, o);
        static_params[static_cast<size_t>(row * r.n_groups + G)] = p;
        r.scales[static_cast<size_t>(row * r.n_groups + G)] = p.scale;
        r.zeros[static_cast<size_t>(row * r.n_groups + G)] = p.zero;
      }
  }

  // Step 2: act-order permutation (descending diag(H), stable).
  std::vector<int64_t>& perm = r.perm;
  if (o.act_order) {
    // Only the quantized columns are reordered; the kept tail stays last.
    std::stable_sort(perm.begin(), perm.begin() + qc, [&](int64_t a, int64_t b) { return H[at(a, a)] > H[at(b, b)]; });
    std::vector<double> Hp(H.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) Hp[at(i, j)] = H[at(perm[size_t(i)], perm[size_t(j)])];
    H.swap(Hp);
    std::vector<float> Wp(Wc.size());
    for (int64_t row = 0; row < out; ++row)
      for (int64_t k = 0; k < n; ++k) Wp[static_cast<size_t>(row * in + k)] = Wc[static_cast<size_t>(row * in + perm[size_t(k)])];
    Wc.swap(Wp);
  }

  // Step 3: dampening.
  double mean_diag = 0;
  for (int64_t i = 0; i < n; ++i) mean_diag += H[at(i, i)];
  mean_diag /= static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) H[at(i, i)] += o.damp * mean_diag;

  // Step 4: U = upper Cholesky factor of H⁻¹ (row-major), Algorithm 1 line 2.
  if (const std::string failure = gptq_inverse_cholesky(H, n); !failure.empty()) not_pd(o, in, failure);
  std::vector<float> U(static_cast<size_t>(n * n), 0.0f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i; j < n; ++j) U[at(i, j)] = static_cast<float>(H[at(i, j)]);
  H.clear();
  H.shrink_to_fit();

  // Step 5: blocks (line 3) and columns (line 4), in the permuted order.
  std::vector<uint8_t> codes_p(static_cast<size_t>(out * in));
  std::vector<float> deq_p(static_cast<size_t>(out * in));
  std::vector<float> W1(static_cast<size_t>(out * B)), E(static_cast<size_t>(out * B)), cur(static_cast<size_t>(g));
  std::vector<double> acur(static_cast<size_t>(g));
  std::vector<QParams> params(static_cast<size_t>(out));
  double loss = 0;
  for (int64_t i1 = 0; i1 < n; i1 += B) {
    const int64_t i2 = std::min(i1 + B, n), cnt = i2 - i1;
    for (int64_t row = 0; row < out; ++row)
      std::copy_n(Wc.data() + row * in + i1, cnt, W1.data() + row * B);
    for (int64_t i = 0; i < cnt; ++i) {
      const int64_t col = i1 + i;
      if (col >= qc) {  // kept tail column: no quantization, it only receives the updates (e = 0)
        for (int64_t row = 0; row < out; ++row) {
          codes_p[static_cast<size_t>(row * in + col)] = 0;
          deq_p[static_cast<size_t>(row * in + col)] = W1[static_cast<size_t>(row * B + i)];
          E[static_cast<size_t>(row * B + i)] = 0.0f;
        }
        continue;
      }
      if (o.static_groups) {
        const int64_t G = perm[size_t(col)] / g;
        for (int64_t row = 0; row < out; ++row) params[size_t(row)] = static_params[static_cast<size_t>(row * r.n_groups + G)];
      } else if (col % g == 0) {  // entering a group: parameters from the current (error-updated) weights
        const int64_t G = col / g, len = std::min(g, qc - col);
        if (o.scale_search)
          for (int64_t j = 0; j < len; ++j) acur[size_t(j)] = diag[size_t(perm[size_t(col + j)])];
        // Rows are independent; the scale search (~60 passes per group) runs them in parallel.
#pragma omp parallel for schedule(static) firstprivate(cur) if (o.scale_search && out * len >= 4096)
        for (int64_t row = 0; row < out; ++row) {
          for (int64_t j = 0; j < len; ++j) {
            const int64_t c = col + j;
            if (c < i2) {
              cur[size_t(j)] = W1[static_cast<size_t>(row * B + (c - i1))];
            } else {  // beyond the block: apply the pending lazy updates of columns i1..col-1
              float v = Wc[static_cast<size_t>(row * in + c)];
              for (int64_t k = 0; k < i; ++k) v -= E[static_cast<size_t>(row * B + k)] * U[at(i1 + k, c)];
              cur[size_t(j)] = v;
            }
          }
          const QParams p = group_params(cur.data(), o.scale_search ? acur.data() : nullptr, len, o);
          params[size_t(row)] = p;
          r.scales[static_cast<size_t>(row * r.n_groups + G)] = p.scale;
          r.zeros[static_cast<size_t>(row * r.n_groups + G)] = p.zero;
        }
      }
      const float d = U[at(col, col)];
      for (int64_t row = 0; row < out; ++row) {
        float* w1 = W1.data() + row * B;
        const float w = w1[i];
        const int c = quant_code(w, params[size_t(row)], maxq);  // line 5
        const float q = dequant(c, params[size_t(row)]);
        codes_p[static_cast<size_t>(row * in + col)] = static_cast<uint8_t>(c);
        deq_p[static_cast<size_t>(row * in + col)] = q;
        const float e = (w - q) / d;  // line 6
        loss += 0.5 * static_cast<double>(e) * static_cast<double>(e);
        E[static_cast<size_t>(row * B + i)] = e;
        const float* u = U.data() + at(col, i1);
        for (int64_t j = i + 1; j < cnt; ++j) w1[j] -= e * u[j];  // line 7
      }
    }
    if (i2 < n)  // line 9: W[:, i2:] −= E · U[i1:i2, i2:]
      ops::sgemm(false, false, out, n - i2, cnt, -1.0f, E.data(), B, U.data() + at(i1, i2), n, 1.0f, Wc.data() + i2, in);
  }

  // Step 6: back to the original column order.
  for (int64_t k = 0; k < n; ++k) {
    const int64_t j = perm[size_t(k)];
    r.g_idx[size_t(j)] = j >= qc ? -1 : static_cast<int32_t>(o.static_groups ? j / g : k / g);
    for (int64_t row = 0; row < out; ++row) {
      r.codes[static_cast<size_t>(row * in + j)] = codes_p[static_cast<size_t>(row * in + k)];
      r.dequantized[static_cast<size_t>(row * in + j)] = deq_p[static_cast<size_t>(row * in + k)];
    }
  }
  r.obq_loss = loss;
  r.hessian_error = hessian_weighted_error(W, r.dequantized.data(), out, in, H0);
  return r;
}

}  // namespace sq
