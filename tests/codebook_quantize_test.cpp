// nuqX codebook encode/decode (quant/codebook_quantize.h): the encoder against a linear scan for
// every width, ties and duplicates, validation; and the whole KVQuant path: fit a codebook
// (calib/weighted_kmeans.h), encode, pack 3-bit, unpack, decode, and get back the k-means cost.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "calib/weighted_kmeans.h"
#include "quant/codebook_quantize.h"
#include "quant/packed_bits.h"
#include "tests/support/expect_error.h"

namespace sq {
namespace {

/// Reference: argmin_j |x − c_j| by a linear scan in double, ties to the lowest index.
uint8_t linear_scan(const std::vector<float>& c, float x) {
  size_t best = 0;
  double bd = std::fabs(double(x) - double(c[0]));
  for (size_t j = 1; j < c.size(); ++j) {
    const double d = std::fabs(double(x) - double(c[j]));
    if (d < bd) {
      bd = d;
      best = j;
    }
  }
  return static_cast<uint8_t>(best);
}

/// Sorted random codebook of 2^bits signposts on the grid 2^-20 in [−1, 1] (so sums, differences
/// and midpoints of signposts and test inputs on the 2^-21 grid are exact in double and the two
/// implementations compare identical quantities), with some duplicates.
std::vector<float> grid_codebook(int bits, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> c(size_t(1) << bits);
  for (auto& v : c) v = std::ldexp(float(int64_t(rng() % (2u << 20)) - (1 << 20)), -20);
  if (c.size() > 3) c[2] = c[1];  // a duplicate
  std::sort(c.begin(), c.end());
  return c;
}

TEST(CodebookQuantize, EncodePicksTheNearestSignpost) {
  int64_t checked = 0;
  for (int bits = 1; bits <= 8; ++bits) {
    for (uint64_t seed = 0; seed < 4; ++seed) {
      const std::vector<float> c = grid_codebook(bits, 10 * bits + seed);
      const CodebookQuantizer q(c, bits);
      std::vector<float> xs;
      std::mt19937_64 rng(seed);
      for (int i = 0; i < 2000; ++i) xs.push_back(std::ldexp(float(int64_t(rng() % (3u << 21)) - (3 << 20)), -21));  // [−1.5, 1.5)
      for (size_t j = 0; j < c.size(); ++j) {
        xs.push_back(c[j]);
        if (j + 1 < c.size()) xs.push_back(0.5f * (c[j] + c[j + 1]));  // exact midpoint (on the 2^-21 grid): tie
      }
      xs.push_back(std::numeric_limits<float>::infinity());
      xs.push_back(-std::numeric_limits<float>::infinity());
      std::vector<uint8_t> codes(xs.size());
      q.encode(xs.data(), int64_t(xs.size()), codes.data());
      for (size_t i = 0; i < xs.size(); ++i) {
        // ±inf: the first index of the largest / smallest signpost (a double scan cannot rank
        // infinite distances).
        const uint8_t top = uint8_t(std::find(c.begin(), c.end(), c.back()) - c.begin());
        const uint8_t ref = std::isinf(xs[i]) ? (xs[i] > 0 ? top : 0) : linear_scan(c, xs[i]);
        ASSERT_EQ(codes[i], ref) << "bits " << bits << " x " << xs[i];
        ASSERT_EQ(q.encode(xs[i]), ref);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 8 * 4 * 2000);
}

TEST(CodebookQuantize, TiesAndDuplicatesGoToTheLowerIndex) {
  const std::vector<float> c = {-1.0f, 0.0f, 0.0f, 0.5f};
  const CodebookQuantizer q(c, 2);
  EXPECT_EQ(q.encode(-0.5f), 0);   // midpoint of −1 and 0: lower
  EXPECT_EQ(q.encode(0.0f), 1);    // duplicate 0 at 1 and 2: first
  EXPECT_EQ(q.encode(0.2f), 1);    // nearer 0 than 0.5: the first of the duplicates, never 2
  EXPECT_EQ(q.encode(0.25f), 1);   // midpoint of 0 and 0.5: lower
  EXPECT_EQ(q.encode(0.26f), 3);
  EXPECT_EQ(q.encode(7.0f), 3);
  EXPECT_EQ(q.encode(-std::numeric_limits<float>::infinity()), 0);
}

TEST(CodebookQuantize, DecodeIsLookupAndRoundTripsSignposts) {
  const std::vector<float> c = grid_codebook(4, 3);
  const CodebookQuantizer q(c, 4);
  std::vector<uint8_t> codes(16);
  q.encode(c.data(), 16, codes.data());
  std::vector<float> back(16);
  q.decode(codes.data(), 16, back.data());
  EXPECT_EQ(back, c);
  const uint8_t bad = 16;
  test::expect_error<std::invalid_argument>([&] { q.decode(&bad, 1, back.data()); }, {"codes[0] = 16", "2^4 = 16"});
}

TEST(CodebookQuantize, ValidatesTheCodebookAndInput) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  test::expect_error<std::invalid_argument>([] { CodebookQuantizer({0.0f, 1.0f, 2.0f}, 2); }, {"3 signposts", "2^2 = 4"});
  test::expect_error<std::invalid_argument>([] { CodebookQuantizer({0.0f, 1.0f, 0.5f, 2.0f}, 2); },
                                            {"signpost 2 = 0.5", "below signpost 1", "non-decreasing"});
  test::expect_error<std::invalid_argument>([&] { CodebookQuantizer({0.0f, nan}, 1); }, {"signpost 1", "not finite"});
  test::expect_error<std::invalid_argument>([] { CodebookQuantizer({0.0f, std::numeric_limits<float>::infinity()}, 1); },
                                            {"not finite"});
  test::expect_error<std::invalid_argument>([] { validate_codebook(std::vector<float>{}, 0); }, {"bits = 0"});
  const CodebookQuantizer q({-1.0f, 1.0f}, 1);
  const std::vector<float> x = {0.0f, nan};
  std::vector<uint8_t> codes(2);
  test::expect_error<std::invalid_argument>([&] { q.encode(x.data(), 2, codes.data()); }, {"x[1] is NaN"});
}

TEST(CodebookQuantize, Nuq3FitEncodePackDecodeReproducesTheKMeansCost) {
  // Heavy-tailed values normalized to [−1, 1] with Fisher-like weights, an exact nuq3 codebook,
  // nearest-signpost codes packed at 3 bits and read back: Σ w (x − decode)² must equal the exact
  // k-means cost, because the optimal 1-D partition is the nearest-centroid (Voronoi) partition.
  // Tolerance 1e-6 relative: the signposts are the double centroids rounded to FP32 (relative
  // 6e-8); at the optimum the cost is stationary in each centroid, so that moves the cost by far
  // less, and the sum is in double.
  std::mt19937_64 rng(5);
  std::student_t_distribution<float> t(3.0f);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const size_t n = 30001;  // odd: the last 3-bit code ends inside a byte
  std::vector<float> x(n), w(n);
  float m = 0;
  for (size_t i = 0; i < n; ++i) {
    x[i] = t(rng);
    m = std::max(m, std::fabs(x[i]));
    const float gi = g(rng);
    w[i] = gi * gi;
  }
  for (float& v : x) v = std::clamp(v / m, -1.0f, 1.0f);
  const KMeans1DResult ex = weighted_kmeans_1d_exact(x, w, 8);
  const CodebookQuantizer q(fit_nuq_codebook(x, w, 3), 3);
  std::vector<uint8_t> codes(n), unpacked(n);
  q.encode(x.data(), int64_t(n), codes.data());
  PackedBits packed(3, int64_t(n));
  packed.pack(0, codes.data(), int64_t(n));
  EXPECT_EQ(packed.bytes().size(), (n * 3 + 7) / 8);
  packed.unpack(0, int64_t(n), unpacked.data());
  ASSERT_EQ(unpacked, codes);
  std::vector<float> dec(n);
  q.decode(unpacked.data(), int64_t(n), dec.data());
  double cost = 0;
  for (size_t i = 0; i < n; ++i) cost += double(w[i]) * (double(x[i]) - dec[i]) * (double(x[i]) - dec[i]);
  EXPECT_NEAR(cost, ex.cost, 1e-6 * ex.cost);
  std::printf("nuq3 on %zu Student-t values: weighted SSE %.9g, exact k-means cost %.9g\n", n, cost, ex.cost);
}

}  // namespace
}  // namespace sq
