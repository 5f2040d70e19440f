#include "calib/q4k_quantize.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "formats/safetensors.h"
#include "quant/q4k_layout.h"

namespace sq {

namespace {

constexpr int64_t kGroup = 32;

/// One group's view: its weights and importance (a, never null here: uniform groups get ones).
struct GroupView {
  const float* w;
  const double* a;
  int64_t len;
};

inline int code_of(float w, float delta, float m) {
  if (!(delta > 0.0f)) return 0;
  return static_cast<int>(std::clamp(std::nearbyint((w - m) / delta), 0.0f, 15.0f));
}

/// E of one group coded with (Δ, m), ŵ = fma(Δ, u, m) as the kernels compute it.
double group_error(const GroupView& g, float delta, float m) {
  double e = 0;
  for (int64_t k = 0; k < g.len; ++k) {
    const double d = double(g.w[k]) - double(std::fma(delta, float(code_of(g.w[k], delta, m)), m));
    e += g.a[k] * d * d;
  }
  return e;
}

struct Params {
  float delta = 0, m = 0;
  double err = 0;
};

/// Step 1 of the file comment: the group's continuous (Δ, m); `minmax` only the min/max rule.
Params group_params(const GroupView& g, bool minmax) {
  float lo = 0.0f, hi = 0.0f;
  for (int64_t k = 0; k < g.len; ++k) {
    lo = std::min(lo, g.w[k]);
    hi = std::max(hi, g.w[k]);
  }
  Params best{(hi - lo) / 15.0f, lo, 0};
  best.err = group_error(g, best.delta, best.m);
  if (minmax || hi == lo) return best;
  const auto consider = [&](float delta, float m) {
    if (!(delta > 0.0f) || !std::isfinite(delta) || !(m <= 0.0f)) return;
    const double e = group_error(g, delta, m);
    if (e < best.err) best = {delta, m, e};
  };
  for (int i = 0; i <= 5; ++i)
    for (int k = 0; k <= 5; ++k) {
      const float l = lo * (1.0f - 0.05f * float(i)), h = hi * (1.0f - 0.05f * float(k));
      const float delta = (h - l) / 15.0f;
      if (!(delta > 0.0f)) continue;
      consider(delta, l);
      // weighted least squares of w ≈ Δ·u + m over this candidate's codes (m ≤ 0 kept)
      double su = 0, suu = 0, sw = 0, swu = 0, s1 = 0;
      for (int64_t j = 0; j < g.len; ++j) {
        const double u = code_of(g.w[j], delta, l), a = g.a[j];
        s1 += a;
        su += a * u;
        suu += a * u * u;
        sw += a * g.w[j];
        swu += a * g.w[j] * u;
      }
      const double det = s1 * suu - su * su;
      if (det > 0) {
        const double D = (s1 * swu - su * sw) / det, M = (suu * sw - su * swu) / det;
        if (M <= 0) consider(float(D), float(M));
        else if (suu > 0) consider(float(swu / suu), 0.0f);
      }
    }
  return best;
}

/// x kept to `bits` significant bits, then as the FP16 value it rounds to (0 for x ≤ 0).
float coarse_fp16(float x, int bits) {
  if (!(x > 0.0f)) return 0.0f;
  int e;
  const float f = std::frexp(x, &e);
  return half_to_float(float_to_half(std::ldexp(std::nearbyint(std::ldexp(f, bits)), e - bits)));
}

inline bool fp16_exact(float v) { return half_to_float(float_to_half(v)) == v; }

/// A super-block's quantized scales.
struct SuperBlock {
  float d = 0, dmin = 0;
  std::array<uint8_t, 8> sc{}, mi{};
  double err = 0;
};

/// Steps 2–3 of the file comment from the groups' continuous parameters p[0 .. n).
SuperBlock two_level(const GroupView* g, const Params* p, int n) {
  float dmax = 0, mmax = 0;
  for (int j = 0; j < n; ++j) {
    dmax = std::max(dmax, p[j].delta);
    mmax = std::max(mmax, -p[j].m);
  }
  SuperBlock best;
  best.err = INFINITY;
  const auto exact = [](float d) {  // every d · sc, sc < 64, an FP16 value (subnormal d may need fewer bits)
    for (int sc = 1; sc < 64; ++sc)
      if (!fp16_exact(d * float(sc))) return false;
    return true;
  };
  const auto scale_of = [&](float max, int t) {
    for (int bits = 5; bits >= 1; --bits) {
      const float d = coarse_fp16(max / float(t), bits);
      if (exact(d)) return d;
    }
    return 0.0f;
  };
  float ds[5], dmins[5];  // t, t' = 63 − i
  for (int i = 0; i < 5; ++i) {
    ds[i] = scale_of(dmax, 63 - i);
    dmins[i] = scale_of(mmax, 63 - i);
  }
  for (int i = 0; i < 5; ++i)
    for (int im = 0; im < 5; ++im) {
      SuperBlock s;
      s.d = ds[i];
      s.dmin = dmins[im];
      for (int j = 0; j < n; ++j) {
        s.sc[j] = s.d > 0 ? uint8_t(std::clamp(std::nearbyint(p[j].delta / s.d), 0.0f, 63.0f)) : 0;
        s.mi[j] = s.dmin > 0 ? uint8_t(std::clamp(std::nearbyint(-p[j].m / s.dmin), 0.0f, 63.0f)) : 0;
        s.err += group_error(g[j], s.d * float(s.sc[j]), -s.dmin * float(s.mi[j]));
      }
      if (s.err < best.err) best = s;
      if (mmax == 0) break;  // dmin is 0 whatever t'
    }
  // step 3: each group's (sc, mi) moved by ±1 where that lowers its error
  best.err = 0;
  for (int j = 0; j < n; ++j) {
    int bsc = best.sc[j], bmi = best.mi[j];
    double be = group_error(g[j], best.d * float(bsc), -best.dmin * float(bmi));
    const int sc0 = bsc, mi0 = bmi;
    for (int ds = -1; ds <= 1; ++ds)
      for (int dm = -1; dm <= 1; ++dm) {
        const int sc = sc0 + ds, mi = mi0 + dm;
        if ((ds == 0 && dm == 0) || sc < 0 || sc > 63 || mi < 0 || mi > 63) continue;
        const double e = group_error(g[j], best.d * float(sc), -best.dmin * float(mi));
        if (e < be) {
          be = e;
          bsc = sc;
          bmi = mi;
        }
      }
    best.sc[j] = uint8_t(bsc);
    best.mi[j] = uint8_t(bmi);
    best.err += be;
  }
  return best;
}

}  // namespace

Int4Weights quantize_q4k(const float* W, int64_t out, int64_t in, const double* importance, const std::string& name) {
  try {
    check_int4_shape(out, in, kGroup);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(name + ": " + e.what());
  }
  const int64_t ng = (in + kGroup - 1) / kGroup, nsb = q4k_superblocks(ng);
  if (importance)
    for (int64_t k = 0; k < in; ++k)
      if (!(importance[k] >= 0) || !std::isfinite(importance[k]))
        throw std::invalid_argument(name + ": importance of column " + std::to_string(k) + " is negative or not finite");
  for (int64_t i = 0; i < out * in; ++i)
    if (!std::isfinite(W[i])) throw std::invalid_argument(name + ": the weight holds NaN or inf");
  Int4Weights q;
  q.out = out;
  q.in = in;
  q.group = kGroup;
  q.asym = true;
  q.packed.assign(static_cast<size_t>(out * in / 2), 0);
  q.superblock_scales.assign(static_cast<size_t>(out * nsb * kQ4kHeadBytes), 0);
  uint8_t* const packed = q.packed.mutable_data();
  // per group: its own importance, or ones when it has none (or all zero)
  std::vector<double> ones(static_cast<size_t>(kGroup), 1.0);
  std::vector<const double*> ga(static_cast<size_t>(ng));
  for (int64_t j = 0; j < ng; ++j) {
    const int64_t len = std::min(kGroup, in - j * kGroup);
    double s = 0;
    if (importance)
      for (int64_t k = 0; k < len; ++k) s += importance[j * kGroup + k];
    ga[size_t(j)] = s > 0 ? importance + j * kGroup : ones.data();
  }
  bool overflow = false;
#pragma omp parallel for schedule(dynamic, 4) reduction(|| : overflow) if (out * in >= (int64_t(1) << 14))
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t b = 0; b < nsb; ++b) {
      const int n = static_cast<int>(std::min(kQ4kGroups, ng - b * kQ4kGroups));
      GroupView g[8];
      Params mm[8], searched[8];
      for (int j = 0; j < n; ++j) {
        const int64_t jj = b * kQ4kGroups + j;
        g[j] = {W + r * in + jj * kGroup, ga[size_t(jj)], std::min(kGroup, in - jj * kGroup)};
        mm[j] = group_params(g[j], true);
        searched[j] = group_params(g[j], false);
      }
      const SuperBlock a = two_level(g, mm, n), s = two_level(g, searched, n);
      const SuperBlock& best = s.err <= a.err ? s : a;
      if (!std::isfinite(best.d) || !std::isfinite(best.dmin) || best.d > 65504.0f || best.dmin > 65504.0f) overflow = true;
      uint8_t* h = q.superblock_scales.data() + (r * nsb + b) * kQ4kHeadBytes;
      const uint16_t d16 = float_to_half(best.d), m16 = float_to_half(best.dmin);
      std::memcpy(h, &d16, 2);
      std::memcpy(h + 2, &m16, 2);
      pack_q4k_scales(best.sc.data(), best.mi.data(), h + 4);  // pairs past n are 0
      for (int j = 0; j < n; ++j) {
        const float delta = best.d * float(best.sc[size_t(j)]), m = -best.dmin * float(best.mi[size_t(j)]);
        for (int64_t k = 0; k < g[j].len; ++k) {
          const int64_t c = (b * kQ4kGroups + j) * kGroup + k;
          const uint8_t u = static_cast<uint8_t>(code_of(g[j].w[k], delta, m));
          packed[r * (in / 2) + c / 2] |= static_cast<uint8_t>((c & 1) ? u << 4 : u);
        }
      }
    }
  }
  if (overflow) throw std::invalid_argument(name + ": a super-block's scale overflows FP16 (|w| too large for Q4_K)");
  expand_q4k_scales(q);
  validate_int4(q);
  return q;
}

double weighted_squared_error(const float* W, const Int4Weights& q, const double* importance) {
  std::vector<float> row(static_cast<size_t>(q.in));
  double e = 0;
  for (int64_t r = 0; r < q.out; ++r) {
    dequantize_int4_row(q, r, row.data());
    for (int64_t k = 0; k < q.in; ++k) {
      const double d = double(W[r * q.in + k]) - double(row[size_t(k)]);
      e += (importance ? importance[k] : 1.0) * d * d;
    }
  }
  return e;
}

}  // namespace sq
