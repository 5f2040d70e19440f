// KVQuant codebook fitting benchmark (issue #4): the exact weighted 1-D k-means DP
// (calib/weighted_kmeans.h) on all distinct values, the DP over a 2^16-bin histogram, and Lloyd's
// algorithm from k-means++ seeds, measured side by side in one run.
//
// Built into sqkit_calib (it calls calib/), not sqkit: see calib/CMakeLists.txt.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

namespace sq::bench {

/// For `n` values drawn from a heavy-tailed distribution (Student t, ν = 3, std::mt19937_64 seed 4)
/// normalized to [−1, 1] by their max |x| (KVQuant §3.3's normalization) with Fisher-like weights
/// w = g², g ~ N(0, 1), and k = 4, 8, 16 (nuq2..nuq4): times weighted_kmeans_1d_exact,
/// weighted_kmeans_1d_histogram (2^16 bins) and weighted_kmeans_1d_lloyd (k-means++ seed 0,
/// ≤ 300 iterations), interleaved (≥ 3 rounds and ≥ `min_seconds` per item, best call kept). The
/// exact DP splits large layers into OpenMP tasks (all threads); the histogram path and Lloyd are
/// single-threaded. Prints seconds, costs relative to the exact optimum, the histogram's a priori
/// bound, Lloyd's iterations, the acceptance line (exact fit of k = 16 < 1 s) and the load average
/// before/after; returns everything as JSON. Throws what the solvers throw.
nlohmann::json run_kmeans_bench(int64_t n, double min_seconds);

}  // namespace sq::bench
