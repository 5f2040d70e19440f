// Weighted 1-D k-means for KVQuant's nuqX codebooks (Hooper et al. 2024, "KVQuant", §3.3, Eq. 2):
//
//     minimize over centroids c_1 ≤ … ≤ c_k:   Σ_i w_i · min_j (x_i − c_j)²
//
// with x_i the (normalized) activations and w_i ≥ 0 their Fisher weights F_ii (the diagonal Fisher
// information, KVQuant App. C). KVQuant calls a generic k-means solver; here the 1-D problem is
// solved EXACTLY.
//
// Exact solver (weighted_kmeans_1d_exact). In 1-D every optimal clustering is contiguous in sorted
// order (each point belongs to its nearest centroid and Voronoi cells on a line are intervals), so
// the problem is a partition of the n sorted distinct values into k consecutive segments:
//
//     D[1][i] = cost(0, i),    D[j][i] = min_{j−1 ≤ m < i} D[j−1][m] + cost(m, i),    answer D[k][n]
//
// where cost(m, i) is the weighted sum of squared deviations of points m..i−1 from their weighted
// mean, O(1) from prefix sums of w, w·x, w·x² (double):  cost = Σw·x² − (Σw·x)² / Σw.
// The segment cost satisfies the (concave) Monge / quadrangle inequality, so the optimal split
// opt_j(i) is monotone non-decreasing in i (Wu 1991, "Optimal quantization by matrix searching",
// J. Algorithms 12; Grønlund, Larsen, Mathiasen, Nielsen, Schneider, Song 2017, "Fast exact k-means,
// k-medians and Bregman divergence clustering in 1D", arXiv:1701.07204). Each layer j is then
// computed by divide and conquer (evaluate the middle i, recurse left with splits ≤ its optimum and
// right with splits ≥ it): O(n log n) per layer, O(k · n log n) in total, O(k · n) memory for the
// int32 split table used to recover the segments (4·k·n bytes; 64 MiB for k = 16, n = 1M).
//
// Preprocessing common to every solver here (the exact DP sorts with an LSD radix sort on the FP32
// bit patterns):
//   - values NaN/±inf, weights negative/NaN/inf, k < 1, mismatched sizes → std::invalid_argument
//     naming the offending index / argument. An empty `weights` span means all weights are 1.
//   - ZERO-WEIGHT POLICY: points with w = 0 do not enter Eq. 2 at all, so they are dropped before
//     solving (they can never change the cost; they also never make a cluster "zero-weight"). If
//     every weight is zero the objective is identically 0 and the codebook undetermined: this throws
//     std::invalid_argument ("all weights are zero") rather than guess. Equal values are merged
//     (weights summed) into one "atom".
//   - values are multiplied by a power of two (exact) so that max|x| ∈ [0.5, 1) and centered at
//     their weighted mean before the prefix sums (less cancellation in Σw·x² − (Σw·x)²/Σw); weights
//     are scaled by a power of two likewise. Results are scaled back; scaling does not change the
//     argmin.
//
// FEWER DISTINCT VALUES THAN k (n_atoms ≤ k): the optimum has cost 0 with one cluster per distinct
// value; the remaining k − n_atoms clusters are EMPTY (weight 0) and their centroids duplicate the
// largest value, so `centroids` stays sorted and has exactly k entries (a codebook with repeated
// top signposts; codebook_quantize maps ties to the lowest index, so the duplicates are never
// emitted).
//
// Exactness. The DP is exact in real arithmetic. In double, costs are compared with an absolute
// error of a few ε · Σw·x² (ε = 2⁻⁵³; x scaled to |x| < 1), so the returned partition's cost is
// within that of the true optimum; `cost` itself is recomputed in a second, direct pass
// Σ w (x − c)² over the points of the returned partition (not from prefix differences).
//
// Histogram fast path (weighted_kmeans_1d_histogram): the points are binned into B equal-width bins
// over [min, max] (h = (max − min)/B); each bin is an atom carrying its exact Σw, Σw·x, Σw·x² (so
// its within-bin sum of squares is accounted for), and the same DP is run over the ≤ B non-empty
// bins. What is exact: the result is the optimal clustering among all clusterings that keep every
// bin whole, and its centroids and cost are the exact weighted means / cost of the original points
// of that partition. Versus the unrestricted optimum it is at most
//     cost_bound = 2 · (max − min) · max_b (W_b · e_b)   ≤ 2 · h · (max − min) · max_b W_b
// worse (W_b = total weight of bin b, e_b ≤ h = extent, largest − smallest value, of its points):
// take the optimal centroids and move every point of a bin to the centroid nearest to one point y
// of that bin; a point x of the bin (|x − y| ≤ e_b) moved from its nearest centroid c to c' gains
// (x − c')² − (x − c)² = (y − c')² − (y − c)² + 2(x − y)(c − c') ≤ 2·e_b·|c − c'|; only bins that
// straddle a Voronoi boundary have moved points, the centroid ranges |c − c'| of different
// straddling bins overlap at most at one centroid so they sum to ≤ c_k − c_1 ≤ max − min, and
// re-optimizing (the DP) can only lower the cost. The bound is loose for peaked data (it charges
// the heaviest bin against the whole range); measured gaps are far smaller (docs/benchmarks.md).
//
// Lloyd baseline (weighted_kmeans_1d_lloyd): k-means++ seeding (Arthur & Vassilvitskii 2007, with
// D² sampling multiplied by the weights) from a deterministic std::mt19937_64 seed, then weighted
// Lloyd iterations (nearest centroid, ties to the lower centroid; centroid = weighted mean; an empty
// cluster keeps its previous centroid) until the centroids stop changing. A local method: it can
// stop in a local optimum, which the exact DP never does.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace sq {

/// Result of a weighted 1-D k-means (all solvers). Values are in the caller's units.
struct KMeans1DResult {
  /// [k] ascending. Weighted mean of each cluster; an empty cluster (only when fewer distinct
  /// positive-weight values than k, or an empty Lloyd cluster) holds a duplicate as documented.
  std::vector<double> centroids;
  /// [k] total weight Σw of each cluster (0 for an empty cluster).
  std::vector<double> cluster_weight;
  /// [k] smallest / largest member value of each cluster (the cluster is exactly the points with
  /// cluster_lo ≤ x ≤ cluster_hi; for empty clusters both equal the centroid).
  std::vector<double> cluster_lo, cluster_hi;
  /// DP solvers only, [k + 1]: cluster j is atoms [cluster_begin[j], cluster_begin[j+1]) of the
  /// sorted atoms (distinct values, or non-empty bins); empty for Lloyd.
  std::vector<int64_t> cluster_begin;
  /// Σ_i w_i (x_i − c_{cluster(i)})², computed directly over the points (double).
  double cost = 0;
  /// Atoms the DP ran on (distinct positive-weight values, or non-empty bins); Lloyd: points with w > 0.
  int64_t n_atoms = 0;
  /// Histogram solver: a priori bound on cost − (optimal cost) (file comment); 0 for the exact DP
  /// (exact up to rounding); −1 for Lloyd (no bound).
  double cost_bound = 0;
  /// Lloyd only: iterations run (0 for the DP solvers).
  int iterations = 0;
};

/// Exact weighted 1-D k-means by dynamic programming over the sorted distinct values with
/// divide-and-conquer over monotone optimal splits (file comment; Wu 1991, Grønlund et al. 2017).
/// `values` [n] FP32, `weights` [n] FP32 ≥ 0 or empty (all 1). Time O(n log n + k · n_atoms log
/// n_atoms), memory ≈ (4·k + 56) · n_atoms bytes. Large layers are split into OpenMP tasks (all
/// threads); the result does not depend on the thread count. AVX-512 scans when compiled for it.
/// Throws std::invalid_argument: k < 1, size mismatch, non-finite value, negative / non-finite
/// weight, all weights zero, more than 2³¹ − 1 distinct values (messages name index and value).
KMeans1DResult weighted_kmeans_1d_exact(std::span<const float> values, std::span<const float> weights, int k);

/// Exact DP over a `bins`-bin weighted histogram of the data (file comment): optimal among
/// bin-respecting clusterings, at most `cost_bound` = 2·(max − min)·max_b W_b·e_b above the
/// unrestricted optimum. O(n + k · bins log bins). `bins` in [1, 2²⁴]; when all values are equal
/// there is one bin. Throws what weighted_kmeans_1d_exact throws, and for `bins` out of range.
KMeans1DResult weighted_kmeans_1d_histogram(std::span<const float> values, std::span<const float> weights, int k,
                                            int bins = 1 << 16);

/// k-means++ seeding (Arthur & Vassilvitskii 2007) with weights: the first seed is drawn with
/// probability ∝ w_i, each next one ∝ w_i · D(x_i)² (D = distance to the nearest seed so far), with
/// std::mt19937_64(seed) and uniform doubles from its top 53 bits (portable, deterministic). When
/// Σ w·D² = 0 (every positive-weight point is already a seed) the remaining seeds duplicate the last
/// one. Returns k seeds, ascending. Throws as weighted_kmeans_1d_exact.
std::vector<double> kmeanspp_seeds(std::span<const float> values, std::span<const float> weights, int k, uint64_t seed);

/// Weighted Lloyd iterations from `initial` centroids (k = initial.size(), any order, finite):
/// assign each point to the nearest centroid (ties to the smaller centroid), move each centroid to
/// its cluster's weighted mean (an empty cluster keeps its centroid), re-sort, and stop when the
/// centroids no longer change or after `max_iterations`. Throws as weighted_kmeans_1d_exact and for
/// a non-finite initial centroid or max_iterations < 0.
KMeans1DResult weighted_lloyd_1d(std::span<const float> values, std::span<const float> weights,
                                 std::vector<double> initial, int max_iterations = 300);

/// The Lloyd baseline: weighted_lloyd_1d from kmeanspp_seeds(values, weights, k, seed).
KMeans1DResult weighted_kmeans_1d_lloyd(std::span<const float> values, std::span<const float> weights, int k,
                                        uint64_t seed, int max_iterations = 300);

/// KVQuant nuqX codebook (§3.3): the 2^bits signposts minimizing Eq. 2 for `values` ALREADY
/// NORMALIZED to [−1, 1] (KVQuant normalizes each vector to [−1, 1], outliers removed, before
/// fitting; this function does not normalize) with Fisher weights F_ii ≥ 0 (`weights`, or empty for
/// all 1). Runs weighted_kmeans_1d_exact when values.size() ≤ `exact_max_points` (default 2²²:
/// 4·16·2²² = 256 MiB of split table at nuq4), else weighted_kmeans_1d_histogram with 2^16 bins
/// (then within its cost_bound of the optimum, file comment). Returns [2^bits] FP32
/// signposts, non-decreasing (centroids rounded to FP32, which is monotone; repeats only when there
/// are fewer distinct values than 2^bits), ready for quant/codebook_quantize.h.
/// Throws std::invalid_argument for bits ∉ [1, 8], a value outside [−1, 1] or NaN (names index and
/// value), and what the solvers throw.
std::vector<float> fit_nuq_codebook(std::span<const float> values, std::span<const float> weights, int bits,
                                    int64_t exact_max_points = int64_t(1) << 22);

}  // namespace sq
