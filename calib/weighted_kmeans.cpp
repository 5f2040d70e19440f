#include "calib/weighted_kmeans.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>

#include "runtime/thread_governor.h"

namespace sq {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

/// What every solver needs to know about the input after validation.
struct InputSummary {
  int64_t positive = 0;      ///< points with w > 0
  double min = 0, max = 0;   ///< value range over w > 0
  double value_scale = 1;    ///< power of two: max|x|·value_scale ∈ [0.5, 1) (1 when all x = 0)
  double weight_scale = 1;   ///< power of two: max w·weight_scale ∈ [0.5, 1)
  double center = 0;         ///< weighted mean of x·value_scale
};

double pow2_scale_for(double max_abs) {
  if (!(max_abs > 0)) return 1.0;
  int e = 0;
  std::frexp(max_abs, &e);  // max_abs = m · 2^e, m ∈ [0.5, 1)
  return std::ldexp(1.0, -e);
}

float weight_at(std::span<const float> weights, size_t i) { return weights.empty() ? 1.0f : weights[i]; }

/// Validates (throws std::invalid_argument naming `fn`, the index and the value) and summarizes.
InputSummary check_and_summarize(const char* fn, std::span<const float> values, std::span<const float> weights, int k) {
  const std::string where = std::string(fn) + ": ";
  if (k < 1) throw std::invalid_argument(where + "k = " + std::to_string(k) + " must be >= 1");
  if (!weights.empty() && weights.size() != values.size())
    throw std::invalid_argument(where + "weights has " + std::to_string(weights.size()) + " entries, values has " +
                                std::to_string(values.size()) + " (expected equal sizes, or empty weights for all 1)");
  if (values.empty()) throw std::invalid_argument(where + "values is empty");
  InputSummary s;
  double max_abs = 0, max_w = 0;
  s.min = kInf;
  s.max = -kInf;
  for (size_t i = 0; i < values.size(); ++i) {
    const float x = values[i], w = weight_at(weights, i);
    if (!std::isfinite(x)) throw std::invalid_argument(where + "values[" + std::to_string(i) + "] = " + num(x) + " is not finite");
    if (!std::isfinite(w) || w < 0)
      throw std::invalid_argument(where + "weights[" + std::to_string(i) + "] = " + num(w) +
                                  (std::isfinite(w) ? " is negative" : " is not finite") + " (Fisher weights must be finite and >= 0)");
    if (w == 0) continue;
    ++s.positive;
    s.min = std::min(s.min, double(x));
    s.max = std::max(s.max, double(x));
    max_abs = std::max(max_abs, std::fabs(double(x)));
    max_w = std::max(max_w, double(w));
  }
  if (s.positive == 0)
    throw std::invalid_argument(where + "all " + std::to_string(values.size()) +
                                " weights are zero (the objective is identically 0; the codebook is undetermined)");
  s.value_scale = pow2_scale_for(max_abs);
  s.weight_scale = pow2_scale_for(max_w);
  double sw = 0, swx = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double w = double(weight_at(weights, i)) * s.weight_scale;
    sw += w;
    swx += w * double(values[i]) * s.value_scale;
  }
  s.center = swx / sw;
  return s;
}

/// One atom of the DP: a distinct value or a histogram bin, with its (scaled, centered) sums.
struct Atoms {
  std::vector<double> pw, ps, pq;  ///< prefix sums [n + 1] of Σw, Σw·x, Σw·x² (scaled, centered)
  int64_t size() const { return static_cast<int64_t>(pw.size()) - 1; }
};

/// Weighted within-segment sum of squares of atoms [m, i) from the prefix sums. A segment whose
/// weight cancels to 0 in double (only with weights below ε × the preceding total) costs 0.
struct SegmentCost {
  const double* W;
  const double* S;
  const double* Q;
  double operator()(int64_t m, int64_t i) const {
    const double w = W[i] - W[m], s = S[i] - S[m], q = Q[i] - Q[m];
    const double c = w > 0 ? q - s * s / w : 0.0;
    return c > 0 ? c : 0.0;
  }
};

/// Leftmost argmin over m ∈ [a, b] of prev[m] + cost(m, i) (b ≥ a); returns {value, m}.
struct ArgMin {
  double value;
  int64_t m;
};

ArgMin scan_scalar(const SegmentCost& cost, const double* prev, int64_t i, int64_t a, int64_t b) {
  ArgMin best{kInf, a};
  for (int64_t m = a; m <= b; ++m) {
    const double v = prev[m] + cost(m, i);
    if (v < best.value) best = {v, m};
  }
  return best;
}

#if defined(__AVX512F__)
/// The same scan, 8 candidates per step: one fused pass (no scratch), per-lane leftmost minima
/// (strict <), then the smallest index among the lanes holding the minimum.
ArgMin scan_avx512(const SegmentCost& cost, const double* prev, int64_t i, int64_t a, int64_t b) {
  const __m512d Wi = _mm512_set1_pd(cost.W[i]), Si = _mm512_set1_pd(cost.S[i]), Qi = _mm512_set1_pd(cost.Q[i]);
  const __m512d zero = _mm512_setzero_pd();
  __m512d best = _mm512_set1_pd(kInf);
  __m512i best_m = _mm512_set1_epi64(a);
  __m512i idx = _mm512_add_epi64(_mm512_set1_epi64(a), _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
  const __m512i eight = _mm512_set1_epi64(8);
  for (int64_t m = a; m <= b; m += 8) {
    const int64_t left = b - m + 1;
    const __mmask8 live = left >= 8 ? __mmask8(0xFF) : __mmask8((1u << left) - 1u);
    const __m512d w = _mm512_sub_pd(Wi, _mm512_maskz_loadu_pd(live, cost.W + m));
    const __m512d sv = _mm512_sub_pd(Si, _mm512_maskz_loadu_pd(live, cost.S + m));
    const __m512d q = _mm512_sub_pd(Qi, _mm512_maskz_loadu_pd(live, cost.Q + m));
    const __mmask8 pos = _mm512_mask_cmp_pd_mask(live, w, zero, _CMP_GT_OQ);
    __m512d c = _mm512_maskz_sub_pd(pos, q, _mm512_maskz_div_pd(pos, _mm512_mul_pd(sv, sv), w));
    c = _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(c, zero, _CMP_GT_OQ), c);  // max(c, 0)
    const __m512d v = _mm512_add_pd(_mm512_maskz_loadu_pd(live, prev + m), c);
    const __mmask8 better = _mm512_mask_cmp_pd_mask(live, v, best, _CMP_LT_OQ);
    best = _mm512_mask_mov_pd(best, better, v);
    best_m = _mm512_mask_mov_epi64(best_m, better, idx);
    idx = _mm512_add_epi64(idx, eight);
  }
  alignas(64) double bv[8];
  alignas(64) int64_t bm[8];
  _mm512_store_pd(bv, best);
  _mm512_store_si512(bm, best_m);
  ArgMin r{kInf, a};
  for (int l = 0; l < 8; ++l)
    if (bv[l] < r.value || (bv[l] == r.value && bm[l] < r.m)) r = {bv[l], bm[l]};
  return r;
}
#endif

/// Divide and conquer over one DP layer: cur[i] = min_{m ∈ [optlo, min(opthi, i−1)]} prev[m] + cost(m, i)
/// for i ∈ [lo, hi], using that the leftmost optimal m is non-decreasing in i. Subproblems above
/// `kTaskRows` rows run as OpenMP tasks (the result does not depend on the thread count).
struct LayerSolver {
  SegmentCost cost;
  const double* prev;
  double* cur;
  int32_t* arg;
  static constexpr int64_t kTaskRows = 1 << 14;

  ArgMin scan(int64_t i, int64_t a, int64_t b) const {
#if defined(__AVX512F__)
    if (b - a >= 16) return scan_avx512(cost, prev, i, a, b);
#endif
    return scan_scalar(cost, prev, i, a, b);
  }

  void solve(int64_t lo, int64_t hi, int64_t optlo, int64_t opthi) const {
    while (lo <= hi) {
      // Small leaf: rows in order, each scanning from the previous row's optimum (monotone).
      if ((hi - lo + 1) * (opthi - optlo + 1) <= 64) {
        int64_t from = optlo;
        for (int64_t i = lo; i <= hi; ++i) {
          const ArgMin r = scan_scalar(cost, prev, i, from, std::min(opthi, i - 1));
          cur[i] = r.value;
          arg[i] = static_cast<int32_t>(r.m);
          from = r.m;
        }
        return;
      }
      const int64_t mid = lo + (hi - lo) / 2;
      const ArgMin r = scan(mid, optlo, std::min(opthi, mid - 1));
      cur[mid] = r.value;
      arg[mid] = static_cast<int32_t>(r.m);
      if (hi - lo >= kTaskRows) {
        const int64_t m = r.m;
#pragma omp task default(none) firstprivate(lo, mid, optlo, m)
        solve(lo, mid - 1, optlo, m);
        lo = mid + 1;
        optlo = m;
        continue;
      }
      // Recurse on the smaller half, loop on the other (bounded stack depth).
      if (mid - lo < hi - mid) {
        solve(lo, mid - 1, optlo, r.m);
        lo = mid + 1;
        optlo = r.m;
      } else {
        solve(mid + 1, hi, r.m, opthi);
        hi = mid - 1;
        opthi = r.m;
      }
    }
  }

  /// Whole layer (rows [lo, hi], splits [optlo, opthi]) on all OpenMP threads.
  void solve_layer(int64_t lo, int64_t hi, int64_t optlo, int64_t opthi) const {
    if (hi - lo < kTaskRows) {
      solve(lo, hi, optlo, opthi);
      return;
    }
    threads::adapt();  // the team for this layer's tasks (runtime/thread_governor.h)
#pragma omp parallel default(none) shared(lo, hi, optlo, opthi)
#pragma omp single
    {
      solve(lo, hi, optlo, opthi);
#pragma omp taskwait
    }
  }
};

/// Optimal partition of the n atoms into min(k, n) non-empty consecutive segments; returns the
/// segment starts [k' + 1] (last = n).
std::vector<int64_t> optimal_partition(const Atoms& atoms, int k) {
  const int64_t n = atoms.size();
  const int64_t kk = std::min<int64_t>(k, n);
  std::vector<int64_t> begin(static_cast<size_t>(kk + 1));
  begin[static_cast<size_t>(kk)] = n;
  if (kk == n) {
    for (int64_t j = 0; j < kk; ++j) begin[static_cast<size_t>(j)] = j;
    return begin;
  }
  if (kk == 1) {
    begin[0] = 0;
    return begin;
  }
  const SegmentCost cost{atoms.pw.data(), atoms.ps.data(), atoms.pq.data()};
  std::vector<double> prev(static_cast<size_t>(n + 1), kInf), cur(static_cast<size_t>(n + 1), kInf);
  // Layer 1: the first segment covers atoms [0, i).
  for (int64_t i = 1; i <= n - (kk - 1); ++i) prev[static_cast<size_t>(i)] = cost(0, i);
  // arg[j][i] (j = 2..kk) = start of the last of j segments covering [0, i).
  std::vector<int32_t> arg(static_cast<size_t>((kk - 1) * (n + 1)), 0);
  LayerSolver solver{cost, nullptr, nullptr, nullptr};
  for (int64_t j = 2; j <= kk; ++j) {
    std::fill(cur.begin(), cur.end(), kInf);
    solver.prev = prev.data();
    solver.cur = cur.data();
    solver.arg = arg.data() + (j - 2) * (n + 1);
    // j segments cover i ∈ [j, n − (kk − j)] atoms; the last starts at m ∈ [j − 1, i − 1].
    const int64_t lo = (j == kk) ? n : j, hi = n - (kk - j);
    solver.solve_layer(lo, hi, j - 1, hi - 1);
    std::swap(prev, cur);
  }
  int64_t i = n;
  for (int64_t j = kk; j >= 2; --j) {
    i = arg[static_cast<size_t>((j - 2) * (n + 1) + i)];
    begin[static_cast<size_t>(j - 1)] = i;
  }
  begin[0] = 0;
  return begin;
}

void build_prefix(Atoms& a, const std::vector<double>& w, const std::vector<double>& s, const std::vector<double>& q) {
  const size_t n = w.size();
  a.pw.assign(n + 1, 0.0);
  a.ps.assign(n + 1, 0.0);
  a.pq.assign(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) {
    a.pw[i + 1] = a.pw[i] + w[i];
    a.ps[i + 1] = a.ps[i] + s[i];
    a.pq[i + 1] = a.pq[i] + q[i];
  }
}

/// Fills centroids, weights, lo/hi and cost from per-point cluster ids (`cluster_of(i)` for every
/// point with w > 0), computed directly in the caller's units (two passes: means, then squares).
template <class ClusterOf>
void finish_from_points(KMeans1DResult& r, int k, std::span<const float> values, std::span<const float> weights,
                        const InputSummary& in, ClusterOf cluster_of) {
  std::vector<double> sw(static_cast<size_t>(k), 0.0), swx(static_cast<size_t>(k), 0.0);
  r.cluster_lo.assign(static_cast<size_t>(k), kInf);
  r.cluster_hi.assign(static_cast<size_t>(k), -kInf);
  for (size_t i = 0; i < values.size(); ++i) {
    const double w = double(weight_at(weights, i)) * in.weight_scale;
    if (w == 0) continue;
    const size_t c = static_cast<size_t>(cluster_of(i));
    const double x = values[i];
    sw[c] += w;
    swx[c] += w * x;
    r.cluster_lo[c] = std::min(r.cluster_lo[c], x);
    r.cluster_hi[c] = std::max(r.cluster_hi[c], x);
  }
  r.centroids.assign(static_cast<size_t>(k), 0.0);
  r.cluster_weight.assign(static_cast<size_t>(k), 0.0);
  for (size_t c = 0; c < size_t(k); ++c) {
    if (sw[c] > 0) {
      // Clamp: rounding of the mean may not leave the cluster's value range.
      r.centroids[c] = std::clamp(swx[c] / sw[c], r.cluster_lo[c], r.cluster_hi[c]);
      r.cluster_weight[c] = sw[c] / in.weight_scale;
    }
  }
  double cost = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double w = double(weight_at(weights, i)) * in.weight_scale;
    if (w == 0) continue;
    const double d = double(values[i]) - r.centroids[static_cast<size_t>(cluster_of(i))];
    cost += w * d * d;
  }
  r.cost = cost / in.weight_scale;
}

/// Empty clusters [first, k) of a DP result: centroid, lo and hi duplicate the largest value.
void pad_empty_clusters(KMeans1DResult& r, int64_t first, int k, double largest) {
  for (int64_t c = first; c < k; ++c) {
    const size_t u = static_cast<size_t>(c);
    r.centroids[u] = r.cluster_lo[u] = r.cluster_hi[u] = largest;
    r.cluster_weight[u] = 0;
  }
}

struct Point {
  float x, w;
};

/// Key whose unsigned order is the numeric order of finite floats (−0 just below +0).
uint32_t sortable_key(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/// Stable LSD radix sort by value (3 passes of 11/11/10 key bits): the same order as std::sort by
/// `x` except that −0 precedes +0 (they compare equal and are merged anyway), several times faster
/// for 10⁶ points.
void sort_by_value(std::vector<Point>& pts) {
  if (pts.size() < 4096) {
    std::sort(pts.begin(), pts.end(), [](const Point& a, const Point& b) { return a.x < b.x; });
    return;
  }
  std::vector<Point> tmp(pts.size());
  for (int shift : {0, 11, 22}) {
    std::vector<size_t> count(2049, 0);
    for (const Point& p : pts) ++count[((sortable_key(p.x) >> shift) & 0x7FFu) + 1];
    for (size_t d = 1; d < count.size(); ++d) count[d] += count[d - 1];
    for (const Point& p : pts) tmp[count[(sortable_key(p.x) >> shift) & 0x7FFu]++] = p;
    pts.swap(tmp);
  }
}

}  // namespace

KMeans1DResult weighted_kmeans_1d_exact(std::span<const float> values, std::span<const float> weights, int k) {
  const InputSummary in = check_and_summarize("weighted_kmeans_1d_exact", values, weights, k);
  // Sort (value, weight) of the positive-weight points and merge equal values.
  std::vector<Point> pts;
  pts.reserve(static_cast<size_t>(in.positive));
  for (size_t i = 0; i < values.size(); ++i) {
    const float w = weight_at(weights, i);
    if (w > 0) pts.push_back({values[i], w});
  }
  sort_by_value(pts);
  std::vector<double> ax, aw, as, aq;  // atom value (caller units), then scaled/centered sums
  ax.reserve(pts.size());
  aw.reserve(pts.size());
  for (size_t i = 0; i < pts.size();) {
    double w = 0;
    size_t j = i;
    for (; j < pts.size() && pts[j].x == pts[i].x; ++j) w += double(pts[j].w) * in.weight_scale;
    ax.push_back(pts[i].x);
    aw.push_back(w);
    i = j;
  }
  pts.clear();
  pts.shrink_to_fit();
  const int64_t n = static_cast<int64_t>(ax.size());
  if (n > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument("weighted_kmeans_1d_exact: " + std::to_string(n) +
                                " distinct values exceed the 2^31 - 1 the DP indexes; use weighted_kmeans_1d_histogram");
  as.resize(static_cast<size_t>(n));
  aq.resize(static_cast<size_t>(n));
  for (size_t i = 0; i < size_t(n); ++i) {
    const double xs = ax[i] * in.value_scale - in.center;
    as[i] = aw[i] * xs;
    aq[i] = aw[i] * xs * xs;
  }
  Atoms atoms;
  build_prefix(atoms, aw, as, aq);
  as = {};
  aq = {};

  KMeans1DResult r;
  r.n_atoms = n;
  r.cluster_begin = optimal_partition(atoms, k);
  atoms = {};
  const int64_t kk = static_cast<int64_t>(r.cluster_begin.size()) - 1;
  // Final pass over the atoms (a merged atom is its points at one value: same sums).
  std::vector<double> sw(static_cast<size_t>(k), 0.0);
  r.centroids.assign(static_cast<size_t>(k), 0.0);
  r.cluster_weight.assign(static_cast<size_t>(k), 0.0);
  r.cluster_lo.assign(static_cast<size_t>(k), 0.0);
  r.cluster_hi.assign(static_cast<size_t>(k), 0.0);
  double cost = 0;
  for (int64_t c = 0; c < kk; ++c) {
    const size_t b = static_cast<size_t>(r.cluster_begin[size_t(c)]), e = static_cast<size_t>(r.cluster_begin[size_t(c) + 1]);
    double w = 0, wx = 0;
    for (size_t a = b; a < e; ++a) {
      w += aw[a];
      wx += aw[a] * ax[a];
    }
    const double mean = std::clamp(wx / w, ax[b], ax[e - 1]);
    for (size_t a = b; a < e; ++a) cost += aw[a] * (ax[a] - mean) * (ax[a] - mean);
    r.centroids[size_t(c)] = mean;
    r.cluster_weight[size_t(c)] = w / in.weight_scale;
    r.cluster_lo[size_t(c)] = ax[b];
    r.cluster_hi[size_t(c)] = ax[e - 1];
  }
  r.cost = cost / in.weight_scale;
  pad_empty_clusters(r, kk, k, ax.back());
  for (int64_t c = kk; c < k; ++c) r.cluster_begin.push_back(n);
  return r;
}

KMeans1DResult weighted_kmeans_1d_histogram(std::span<const float> values, std::span<const float> weights, int k, int bins) {
  if (bins < 1 || bins > (1 << 24))
    throw std::invalid_argument("weighted_kmeans_1d_histogram: bins = " + std::to_string(bins) + " must be in [1, 2^24]");
  const InputSummary in = check_and_summarize("weighted_kmeans_1d_histogram", values, weights, k);
  const int B = in.max > in.min ? bins : 1;
  const double range = in.max - in.min;
  const double inv_h = B > 1 ? double(B) / range : 0.0;
  auto bin_of = [&](double x) {
    const double t = (x - in.min) * inv_h;
    return std::min(static_cast<int>(t), B - 1);  // t ≥ 0: x ≥ min
  };
  std::vector<double> bw(static_cast<size_t>(B), 0.0), bs(static_cast<size_t>(B), 0.0), bq(static_cast<size_t>(B), 0.0);
  std::vector<float> blo(static_cast<size_t>(B), std::numeric_limits<float>::infinity()),
      bhi(static_cast<size_t>(B), -std::numeric_limits<float>::infinity());
  for (size_t i = 0; i < values.size(); ++i) {
    const double w = double(weight_at(weights, i)) * in.weight_scale;
    if (w == 0) continue;
    const size_t b = static_cast<size_t>(bin_of(values[i]));
    const double xs = double(values[i]) * in.value_scale - in.center;
    bw[b] += w;
    bs[b] += w * xs;
    bq[b] += w * xs * xs;
    blo[b] = std::min(blo[b], values[i]);
    bhi[b] = std::max(bhi[b], values[i]);
  }
  // Atoms = non-empty bins, in bin order.
  std::vector<int32_t> atom_of_bin(static_cast<size_t>(B), -1);
  std::vector<double> aw, as, aq;
  double max_w_extent = 0;  // max over bins of W_b · (largest − smallest value in b)
  for (size_t b = 0; b < size_t(B); ++b) {
    if (bw[b] == 0) continue;
    atom_of_bin[b] = static_cast<int32_t>(aw.size());
    aw.push_back(bw[b]);
    as.push_back(bs[b]);
    aq.push_back(bq[b]);
    max_w_extent = std::max(max_w_extent, bw[b] * (double(bhi[b]) - double(blo[b])));
  }
  bw = bs = bq = {};
  Atoms atoms;
  build_prefix(atoms, aw, as, aq);
  KMeans1DResult r;
  r.n_atoms = atoms.size();
  r.cluster_begin = optimal_partition(atoms, k);
  const int64_t kk = static_cast<int64_t>(r.cluster_begin.size()) - 1;
  std::vector<int32_t> cluster_of_atom(static_cast<size_t>(r.n_atoms));
  for (int64_t c = 0; c < kk; ++c)
    for (int64_t a = r.cluster_begin[size_t(c)]; a < r.cluster_begin[size_t(c) + 1]; ++a) cluster_of_atom[size_t(a)] = int32_t(c);
  finish_from_points(r, k, values, weights, in, [&](size_t i) {
    return cluster_of_atom[static_cast<size_t>(atom_of_bin[static_cast<size_t>(bin_of(values[i]))])];
  });
  pad_empty_clusters(r, kk, k, in.max);
  for (int64_t c = kk; c < k; ++c) r.cluster_begin.push_back(r.n_atoms);
  r.cost_bound = 2.0 * range * (max_w_extent / in.weight_scale);
  return r;
}

std::vector<double> kmeanspp_seeds(std::span<const float> values, std::span<const float> weights, int k, uint64_t seed) {
  check_and_summarize("kmeanspp_seeds", values, weights, k);
  std::mt19937_64 rng(seed);
  auto uniform = [&rng] { return double(rng() >> 11) * 0x1.0p-53; };  // [0, 1)
  const size_t n = values.size();
  // Pick index with probability ∝ p(i) (p ≥ 0, total > 0).
  auto draw = [&](auto p, double total) {
    const double target = uniform() * total;
    double acc = 0;
    size_t last_positive = n;
    for (size_t i = 0; i < n; ++i) {
      const double pi = p(i);
      if (pi <= 0) continue;
      acc += pi;
      last_positive = i;
      if (acc > target) return i;
    }
    return last_positive;  // rounding: the running sum fell short of total
  };
  double total_w = 0;
  for (size_t i = 0; i < n; ++i) total_w += weight_at(weights, i);
  std::vector<double> seeds;
  seeds.push_back(values[draw([&](size_t i) { return double(weight_at(weights, i)); }, total_w)]);
  std::vector<double> d2(n);
  for (size_t i = 0; i < n; ++i) d2[i] = (double(values[i]) - seeds[0]) * (double(values[i]) - seeds[0]);
  while (static_cast<int>(seeds.size()) < k) {
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += double(weight_at(weights, i)) * d2[i];
    if (!(total > 0)) {
      seeds.push_back(seeds.back());
      continue;
    }
    const double c = values[draw([&](size_t i) { return double(weight_at(weights, i)) * d2[i]; }, total)];
    seeds.push_back(c);
    for (size_t i = 0; i < n; ++i) d2[i] = std::min(d2[i], (double(values[i]) - c) * (double(values[i]) - c));
  }
  std::sort(seeds.begin(), seeds.end());
  return seeds;
}

KMeans1DResult weighted_lloyd_1d(std::span<const float> values, std::span<const float> weights, std::vector<double> initial,
                                 int max_iterations) {
  const int k = static_cast<int>(initial.size());
  const InputSummary in = check_and_summarize("weighted_lloyd_1d", values, weights, k);
  if (max_iterations < 0)
    throw std::invalid_argument("weighted_lloyd_1d: max_iterations = " + std::to_string(max_iterations) + " must be >= 0");
  for (size_t j = 0; j < initial.size(); ++j)
    if (!std::isfinite(initial[j]))
      throw std::invalid_argument("weighted_lloyd_1d: initial[" + std::to_string(j) + "] = " + num(initial[j]) + " is not finite");
  std::vector<double> c = std::move(initial);
  std::sort(c.begin(), c.end());
  std::vector<double> mids(static_cast<size_t>(k > 1 ? k - 1 : 0));
  auto update_mids = [&] {
    for (size_t j = 0; j + 1 < c.size(); ++j) mids[j] = 0.5 * (c[j] + c[j + 1]);
  };
  // Nearest centroid, ties to the lower one: the number of midpoints strictly below x.
  auto assign = [&](double x) -> int {
    if (k <= 32) {
      int idx = 0;
      for (double m : mids) idx += m < x;
      return idx;
    }
    return static_cast<int>(std::lower_bound(mids.begin(), mids.end(), x) - mids.begin());
  };
  KMeans1DResult r;
  r.n_atoms = in.positive;
  r.cost_bound = -1;
  std::vector<double> sw(static_cast<size_t>(k)), swx(static_cast<size_t>(k));
  int it = 0;
  for (; it < max_iterations; ++it) {
    update_mids();
    std::fill(sw.begin(), sw.end(), 0.0);
    std::fill(swx.begin(), swx.end(), 0.0);
    for (size_t i = 0; i < values.size(); ++i) {
      const double w = double(weight_at(weights, i)) * in.weight_scale;
      if (w == 0) continue;
      const double x = values[i];
      const size_t a = static_cast<size_t>(assign(x));
      sw[a] += w;
      swx[a] += w * x;
    }
    std::vector<double> next = c;
    for (size_t j = 0; j < size_t(k); ++j)
      if (sw[j] > 0) next[j] = swx[j] / sw[j];
    std::sort(next.begin(), next.end());
    if (next == c) break;
    c = std::move(next);
  }
  r.iterations = it;
  update_mids();
  finish_from_points(r, k, values, weights, in, [&](size_t i) { return assign(values[i]); });
  // finish_from_points recomputed the means of the final assignment; empty clusters keep theirs.
  for (size_t j = 0; j < size_t(k); ++j)
    if (r.cluster_weight[j] == 0) r.centroids[j] = r.cluster_lo[j] = r.cluster_hi[j] = c[j];
  // The recomputed means are the fixed point's (up to summation order); re-sort defensively.
  std::vector<size_t> order(static_cast<size_t>(k));
  for (size_t j = 0; j < order.size(); ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return r.centroids[a] < r.centroids[b]; });
  KMeans1DResult s = r;
  for (size_t j = 0; j < order.size(); ++j) {
    s.centroids[j] = r.centroids[order[j]];
    s.cluster_weight[j] = r.cluster_weight[order[j]];
    s.cluster_lo[j] = r.cluster_lo[order[j]];
    s.cluster_hi[j] = r.cluster_hi[order[j]];
  }
  return s;
}

KMeans1DResult weighted_kmeans_1d_lloyd(std::span<const float> values, std::span<const float> weights, int k, uint64_t seed,
                                        int max_iterations) {
  return weighted_lloyd_1d(values, weights, kmeanspp_seeds(values, weights, k, seed), max_iterations);
}

std::vector<float> fit_nuq_codebook(std::span<const float> values, std::span<const float> weights, int bits,
                                    int64_t exact_max_points) {
  if (bits < 1 || bits > 8) throw std::invalid_argument("fit_nuq_codebook: bits = " + std::to_string(bits) + " must be in [1, 8]");
  for (size_t i = 0; i < values.size(); ++i)
    if (!(values[i] >= -1.0f && values[i] <= 1.0f))
      throw std::invalid_argument("fit_nuq_codebook: values[" + std::to_string(i) + "] = " + num(values[i]) +
                                  " is outside [-1, 1] (normalize each vector to [-1, 1] first, KVQuant §3.3)");
  const int k = 1 << bits;
  const KMeans1DResult r = static_cast<int64_t>(values.size()) <= exact_max_points
                               ? weighted_kmeans_1d_exact(values, weights, k)
                               : weighted_kmeans_1d_histogram(values, weights, k);
  std::vector<float> cb(r.centroids.size());
  for (size_t j = 0; j < cb.size(); ++j) cb[j] = static_cast<float>(r.centroids[j]);  // rounding is monotone: stays sorted
  return cb;
}

}  // namespace sq
