// ops::WeightMatmul (oneDNN matmul on plain and packed weights) and DenseLinear's multi-row path
// against an FP64 product computed here.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/linear.h"
#include "ops/sgemm.h"
#include "ops/weight_matmul.h"
#include "tests/support/random_values.h"

namespace sq {
namespace {

using test::normal_floats;

/// y[n, out] = x[n, in] · W[out, in]ᵀ in double; also Σ|x·w| per output for the tolerance.
void reference(const std::vector<float>& x, const std::vector<float>& w, int64_t n, int64_t out, int64_t in, std::vector<double>& y,
               std::vector<double>& mag) {
  y.assign(static_cast<size_t>(n * out), 0.0);
  mag.assign(static_cast<size_t>(n * out), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < out; ++j) {
      double s = 0, m = 0;
      for (int64_t i = 0; i < in; ++i) {
        const double p = double(x[size_t(t * in + i)]) * double(w[size_t(j * in + i)]);
        s += p;
        m += std::fabs(p);
      }
      y[size_t(t * out + j)] = s;
      mag[size_t(t * out + j)] = m;
    }
}

/// Max over outputs of |y − ref| / Σ|x·w|. An FP32 sum of `in` products in any order is within
/// in·2^-24 of this magnitude (Higham, §3.1), so 1e-5 covers in ≤ 160 and the blocked kernels'
/// shorter partial sums for larger in (their error grows with the block depth, not with in).
double rel_error(const std::vector<float>& y, const std::vector<double>& ref, const std::vector<double>& mag) {
  double e = 0;
  for (size_t i = 0; i < y.size(); ++i) e = std::max(e, std::fabs(double(y[i]) - ref[i]) / std::max(mag[i], 1e-30));
  return e;
}

struct Shape {
  int64_t out, in;
};

TEST(WeightMatmul, PlainAndPackedEqualAnFp64ProductAtManyRowCounts) {
  for (const Shape s : {Shape{64, 64}, Shape{37, 19}, Shape{192, 576}, Shape{576, 1536}, Shape{1, 300}}) {
    const auto w = normal_floats(s.out * s.in, 1);
    for (const ops::WeightLayout layout : {ops::WeightLayout::Plain, ops::WeightLayout::Packed}) {
      const ops::WeightMatmul mm(w.data(), s.out, s.in, layout, 256);
      EXPECT_EQ(mm.packed_bytes() > 0, layout == ops::WeightLayout::Packed);
      for (const int64_t n : {256, 1, 2, 3, 17, 64, 255, 513}) {  // the hint first, then others
        const auto x = normal_floats(n * s.in, uint32_t(n));
        std::vector<float> y(static_cast<size_t>(n * s.out), std::nanf(""));
        ASSERT_TRUE(mm.forward(x.data(), n, y.data())) << s.out << "x" << s.in << " n=" << n;
        std::vector<double> ref, mag;
        reference(x, w, n, s.out, s.in, ref, mag);
        EXPECT_LT(rel_error(y, ref, mag), 1e-5) << s.out << "x" << s.in << " n=" << n << " packed=" << int(layout);
      }
    }
  }
}

// Row counts run as a body (a multiple of kRowStep) plus a zero-padded kRowStep-row tail: after
// kMaxShapes distinct bodies a new body is refused, while any count made of kept bodies and the tail
// is still served, and correct.
TEST(WeightMatmul, RefusesBodiesBeyondTheCacheAndStaysCorrectForTheCachedOnes) {
  const int64_t out = 48, in = 40, step = ops::WeightMatmul::kRowStep, shapes = ops::WeightMatmul::kMaxShapes;
  const auto w = normal_floats(out * in, 2);
  const ops::WeightMatmul mm(w.data(), out, in, ops::WeightLayout::Packed, 8);  // 8: no multiple of kRowStep, not kept
  const int64_t max_rows = (shapes + 1) * step + step - 1;
  std::vector<float> y(static_cast<size_t>(max_rows * out));
  const auto x = normal_floats(max_rows * in, 3);
  for (int64_t k = 1; k <= shapes; ++k) ASSERT_TRUE(mm.forward(x.data(), k * step, y.data())) << k * step;
  EXPECT_FALSE(mm.forward(x.data(), (shapes + 1) * step, y.data()));
  EXPECT_FALSE(mm.forward(x.data(), (shapes + 1) * step + 3, y.data()));
  for (const int64_t n : {int64_t(9), 5 * step + 7, shapes * step + step - 1}) {
    std::vector<float> yn(static_cast<size_t>(n * out), std::nanf(""));
    ASSERT_TRUE(mm.forward(x.data(), n, yn.data())) << n;
    std::vector<double> ref, mag;
    reference(std::vector<float>(x.begin(), x.begin() + n * in), w, n, out, in, ref, mag);
    EXPECT_LT(rel_error(yn, ref, mag), 1e-5) << n;  // the FP32 bound of the test above
  }
}

TEST(WeightMatmul, RejectsAnEmptyShape) {
  const std::vector<float> w(4, 1.0f);
  EXPECT_THROW(ops::WeightMatmul(w.data(), 0, 4, ops::WeightLayout::Packed), std::runtime_error);
  EXPECT_THROW(ops::WeightMatmul(w.data(), 4, 1, ops::WeightLayout::Packed, 0), std::runtime_error);
}

// DenseLinear: the packed path (default), the plain path (set_prepack(false)), products of few rows
// (ops::sgemm) and single rows all equal the FP64 product, with the bias added; the packed copy
// appears at the first product of 32 rows or more.
TEST(DenseLinearPacked, MultiRowProductsMatchFp64WithAndWithoutThePackedCopy) {
  const int64_t out = 96, in = 160;
  const auto w = normal_floats(out * in, 4), b = normal_floats(out, 5);
  for (const bool prepack : {true, false}) {
    DenseLinear lin(Tensor::from_vector({out, in}, w), Tensor::from_vector({out}, b));
    lin.set_prepack(prepack);
    EXPECT_EQ(lin.packed_bytes(), 0);
    for (const int64_t n : {7, 1, 512, 100, 512}) {
      const auto x = normal_floats(n * in, uint32_t(10 + n));
      std::vector<float> y(static_cast<size_t>(n * out));
      lin.forward(x.data(), n, y.data());
      std::vector<double> ref, mag;
      reference(x, w, n, out, in, ref, mag);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < out; ++j) ref[size_t(t * out + j)] += b[size_t(j)], mag[size_t(t * out + j)] += std::fabs(b[size_t(j)]);
      EXPECT_LT(rel_error(y, ref, mag), 1e-5) << "prepack=" << prepack << " n=" << n;
      if (n < 32) EXPECT_EQ(lin.packed_bytes(), 0) << "fewer than 32 rows do not pack (a short prompt)";
    }
    // The copy exists exactly where the primitive pays (AVX-512); elsewhere no product packs.
    if (ops::weight_matmul_pays()) EXPECT_EQ(lin.packed_bytes() >= out * in * 4, prepack);
    else EXPECT_EQ(lin.packed_bytes(), 0);
  }
}

// forward is documented as safe to call concurrently. The threads of an OpenMP region (as sq-eval
// runs its chunks) each call the same DenseLinear; every result equals the serial one. (With
// oneDNN's library-managed scratchpad the concurrent calls corrupted each other's results, up to
// PPL 4502 instead of 55.7 on stories260K; weight_matmul.cpp gives each thread its own.)

/// Calls one DenseLinear [out, in] on n-row inputs from the two threads of an OpenMP region, 16
/// calls per round, 20 rounds; every result must equal the serial one.
void concurrent_calls(int64_t out, int64_t in, int64_t n) {
  constexpr int kCalls = 16;
  const auto w = normal_floats(out * in, 6);
  DenseLinear shared(Tensor::from_vector({out, in}, w));
  DenseLinear serial(Tensor::from_vector({out, in}, w));
  std::vector<std::vector<float>> x(kCalls), got(kCalls), want(kCalls);
  for (int k = 0; k < kCalls; ++k) {
    x[size_t(k)] = normal_floats(n * in, uint32_t(20 + k));
    want[size_t(k)].resize(static_cast<size_t>(n * out));
    serial.forward(x[size_t(k)].data(), n, want[size_t(k)].data());
  }
  for (int round = 0; round < 20; ++round) {
    for (auto& g : got) g.assign(static_cast<size_t>(n * out), 0.0f);
#pragma omp parallel for schedule(static, 1) num_threads(2)
    for (int k = 0; k < kCalls; ++k) shared.forward(x[size_t(k)].data(), n, got[size_t(k)].data());
    for (int k = 0; k < kCalls; ++k) ASSERT_EQ(got[size_t(k)], want[size_t(k)]) << "round " << round << " call " << k;
  }
}

// ops::linear_sgemm (DenseLinear's product where oneDNN's matmul primitive does not pay): equal to
// the FP64 product, and bit for bit the same result on 1 or 2 threads and inside a parallel region
// (its blocks of output rows depend on the shape alone, each one single-threaded sgemm). Shapes:
// fewer rows of W than one block, a ragged last block, and products below kOneDnnMinMacs.
TEST(LinearSgemm, MatchesFp64AndDoesNotDependOnTheThreads) {
  for (const Shape s : {Shape{48, 40}, Shape{64, 64}, Shape{200, 96}, Shape{576, 160}, Shape{5, 7}})
    for (const int64_t n : {int64_t(1), int64_t(3), int64_t(100)}) {
      SCOPED_TRACE(std::to_string(s.out) + "x" + std::to_string(s.in) + " n=" + std::to_string(n));
      const auto w = normal_floats(s.out * s.in, 31), x = normal_floats(n * s.in, 32);
      std::vector<double> ref, mag;
      reference(x, w, n, s.out, s.in, ref, mag);
      const size_t len = static_cast<size_t>(n * s.out);
      std::vector<float> one(len, NAN), two(len, NAN), nested(len, NAN);
      const int saved = omp_get_max_threads();
      omp_set_num_threads(1);
      ops::linear_sgemm(x.data(), n, w.data(), s.out, s.in, one.data());
      omp_set_num_threads(2);
      ops::linear_sgemm(x.data(), n, w.data(), s.out, s.in, two.data());
#pragma omp parallel num_threads(2)
      {
#pragma omp single
        ops::linear_sgemm(x.data(), n, w.data(), s.out, s.in, nested.data());
      }
      omp_set_num_threads(saved);
      EXPECT_LT(rel_error(one, ref, mag), 1e-5);
      EXPECT_EQ(one, two);
      EXPECT_EQ(one, nested);
    }
}

TEST(DenseLinearPacked, ConcurrentCallsGiveTheSerialResult) {
  for (const Shape s : {Shape{64, 64}, Shape{512, 64}, Shape{172, 64}, Shape{64, 172}, Shape{192, 256}})
    for (const int64_t n : {int64_t(128), int64_t(96)}) {
      SCOPED_TRACE(std::to_string(s.out) + "x" + std::to_string(s.in) + " n=" + std::to_string(n));
      concurrent_calls(s.out, s.in, n);
    }
}

// ops::sgemm called outside parallel regions (GPTQ's lazy-batch update, the decoder's backward pass,
// Hessians) runs on the current team, which the thread governor (runtime/thread_governor.h) changes
// with the load: its results must not depend on the team size. Shapes of SmolLM2's GPTQ update
// (out × remaining columns × a 128-column block) and backward products (K up to 1536).
TEST(Sgemm, ResultsDoNotDependOnTheTeamSize) {
  struct Mnk {
    int64_t m, n, k;
  };
  for (const Mnk s : {Mnk{576, 1408, 128}, Mnk{1536, 448, 128}, Mnk{512, 576, 1536}, Mnk{576, 1536, 512}, Mnk{96, 4096, 576}}) {
    SCOPED_TRACE(std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k));
    const auto a = normal_floats(s.m * s.k, 41), b = normal_floats(s.k * s.n, 42);
    std::vector<std::vector<float>> c;
    const int saved = omp_get_max_threads();
    for (const int t : {1, 2, 3}) {
      omp_set_num_threads(t);
      c.emplace_back(static_cast<size_t>(s.m * s.n), NAN);
      ops::sgemm(false, false, s.m, s.n, s.k, 1.0f, a.data(), s.k, b.data(), s.n, 0.0f, c.back().data(), s.n);
    }
    omp_set_num_threads(saved);
    EXPECT_EQ(c[0], c[1]);
    EXPECT_EQ(c[0], c[2]);
  }
}

}  // namespace
}  // namespace sq
