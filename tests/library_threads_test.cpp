// Results that must not depend on the OpenMP thread count (issue 38): the thread governor changes
// the team with the load and users pick -t, so every BLAS/LAPACK call sqkit makes plans for one
// thread on a partition fixed by the shape (ops/library_threads.h). OpenBLAS 0.3.21's own threading
// gave other bits at 2 threads than at 1 for dpotrf (every size) and dsyrk (d = 64), and at 3
// threads for sgemv (640-wide rows) and dgemm; the shapes below are those.
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "calib/gptq.h"
#include "calib/hessian.h"
#include "core/tensor.h"
#include "model/linear.h"
#include "ops/library_threads.h"
#include "ops/sgemm.h"

namespace sq {
namespace {

template <typename T>
std::vector<T> normal(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d;
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) x = static_cast<T>(d(rng));
  return v;
}

/// f() with 1, 2, 3 and 4 OpenMP threads, then with 2 inside a one-thread (inactive) region, where
/// a library that sizes its threading from omp_get_max_threads() would still fork; the results.
template <typename R>
std::vector<R> at_team_sizes(const std::function<R()>& f) {
  std::vector<R> r;
  for (const int t : {1, 2, 3, 4}) {
    const ops::ScopedOmpThreads team(t);
    r.push_back(f());
  }
  const ops::ScopedOmpThreads two(2);
#pragma omp parallel num_threads(1)
  r.push_back(f());
  return r;
}

template <typename R>
void expect_all_equal(const std::vector<R>& r) {
  for (size_t i = 1; i < r.size(); ++i) EXPECT_TRUE(r[i] == r[0]) << "run " << i << " (team " << (i < 4 ? i + 1 : 2) << ") differs from 1 thread";
}

// The FP32 decode step's product (DenseLinear::forward with n = 1, ops::linear_sgemv): SmolLM2's and
// Gemma 3's widths. (One whole-matrix OpenBLAS sgemv, as before 2026-11-30, gave other bits at 3
// threads than at 1 for the 640-wide shapes.)
TEST(LibraryThreads, LinearSgemvDoesNotDependOnTheTeamAndMatchesFp64) {
  struct Shape {
    int64_t out, in;
  };
  for (const Shape s : {Shape{640, 640}, Shape{2048, 640}, Shape{8203, 640}, Shape{1536, 576}, Shape{576, 1536}}) {
    SCOPED_TRACE(std::to_string(s.out) + "x" + std::to_string(s.in));
    const auto W = normal<float>(s.out * s.in, 7), x = normal<float>(s.in, 8);
    const DenseLinear lin(Tensor::from_vector({s.out, s.in}, W));
    const auto r = at_team_sizes<std::vector<float>>([&] {
      std::vector<float> y(static_cast<size_t>(s.out), NAN);
      lin.forward(x.data(), 1, y.data());
      return y;
    });
    expect_all_equal(r);
    // Each output is an FP32 dot product of `in` terms: its rounding error is about √in·2⁻²⁴·Σ|w·x|
    // (≤ 1.5e-6·Σ|w·x| at in = 640) for any summation order; 8e-6·Σ|w·x| is 5× that, and a wrong or
    // misplaced row is off by the order of Σ|w·x| itself.
    for (int64_t j = 0; j < s.out; ++j) {
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < s.in; ++i) {
        ref += double(W[size_t(j * s.in + i)]) * x[size_t(i)];
        mag += std::fabs(double(W[size_t(j * s.in + i)]) * x[size_t(i)]);
      }
      ASSERT_NEAR(r[0][size_t(j)], ref, 8e-6 * mag) << "row " << j;
    }
  }
}

// Hessians 2XᵀX (calib/hessian.h): the blocked upper-triangle product against a plain FP64 sum.
TEST(LibraryThreads, HessianDoesNotDependOnTheTeamAndMatchesTheSum) {
  for (const int64_t d : {int64_t{64}, int64_t{200}, int64_t{576}}) {
    SCOPED_TRACE("width " + std::to_string(d));
    const int64_t n = 512;
    const auto x = normal<float>(n * d, 11);
    const auto r = at_team_sizes<std::vector<double>>([&] {
      HessianAccumulator h(d);
      h.observe(x.data(), n);
      return h.hessian();
    });
    expect_all_equal(r);
    // FP32 sums of 512 FP32 products (one block, calib/hessian.h), then FP64: |error| ≤ γ₅₁₃ =
    // 513·2⁻²⁴ ≈ 3.06e-5 of Σ|2 x_i x_j| (Higham, Thm 3.1); 3.1e-5 is that bound.
    for (int64_t i = 0; i < d; i += 7)
      for (int64_t j = 0; j < d; j += 5) {
        double ref = 0, mag = 0;
        for (int64_t t = 0; t < n; ++t) {
          ref += 2.0 * double(x[size_t(t * d + i)]) * double(x[size_t(t * d + j)]);
          mag += 2.0 * std::fabs(double(x[size_t(t * d + i)]) * double(x[size_t(t * d + j)]));
        }
        ASSERT_NEAR(r[0][size_t(i * d + j)], ref / double(n), 3.1e-5 * mag / double(n)) << i << ", " << j;
      }
  }
}

// GPTQ's factorization (dpotrf of the reversed H, dtrtri): the Hessian of 1,024 tokens at SmolLM2's
// width, damped as gptq_quantize does. Checked also as a factorization: U upper triangular with a
// positive diagonal and Uᵀ·U·H = I, which determine U uniquely (the reference's factor).
TEST(LibraryThreads, GptqInverseCholeskyDoesNotDependOnTheTeamAndInverts) {
  const int64_t in = 576, n = 1024;
  const auto x = normal<float>(n * in, 22);
  HessianAccumulator acc(in);
  acc.observe(x.data(), n);
  std::vector<double> H = acc.hessian();
  double mean_diag = 0;
  for (int64_t i = 0; i < in; ++i) mean_diag += H[size_t(i * in + i)] / double(in);
  for (int64_t i = 0; i < in; ++i) H[size_t(i * in + i)] += 0.01 * mean_diag;
  const auto r = at_team_sizes<std::vector<double>>([&] {
    std::vector<double> f = H;
    EXPECT_EQ(gptq_inverse_cholesky(f, in), "");
    return f;
  });
  expect_all_equal(r);
  // (UᵀU)·H = I: H's condition number here is ~(1 + √(576/1024))² / (1 − √(576/1024))² ≈ 50 (a
  // Marchenko–Pastur spectrum), so FP64 residuals stay below 1e-12; 1e-9 leaves a wide margin.
  const std::vector<double>& U = r[0];
  for (int64_t i = 0; i < in; ++i) {
    ASSERT_GT(U[size_t(i * in + i)], 0.0) << i;
    for (int64_t j = 0; j < i; ++j) ASSERT_EQ(U[size_t(i * in + j)], 0.0) << i << ", " << j;
  }
  std::vector<double> Hinv(size_t(in * in), 0.0);
  for (int64_t i = 0; i < in; ++i)
    for (int64_t j = 0; j < in; ++j) {
      double s = 0;
      for (int64_t k = 0; k <= std::min(i, j); ++k) s += U[size_t(k * in + i)] * U[size_t(k * in + j)];
      Hinv[size_t(i * in + j)] = s;
    }
  for (int64_t i = 0; i < in; i += 17)
    for (int64_t j = 0; j < in; j += 13) {
      double s = 0;
      for (int64_t k = 0; k < in; ++k) s += Hinv[size_t(i * in + k)] * H[size_t(k * in + j)];
      ASSERT_NEAR(s, i == j ? 1.0 : 0.0, 1e-9) << i << ", " << j;
    }
  std::vector<double> not_pd(4, 0.0);  // [[0, 0], [0, 0]]
  EXPECT_NE(gptq_inverse_cholesky(not_pd, 2), "");
}

TEST(LibraryThreads, DgemmDoesNotDependOnTheTeamAndMatchesTheSum) {
  struct Mnk {
    int64_t m, n, k;
  };
  for (const Mnk s : {Mnk{256, 64, 64}, Mnk{256, 1024, 1024}, Mnk{300, 130, 70}}) {
    SCOPED_TRACE(std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k));
    const auto a = normal<double>(s.m * s.k, 31), b = normal<double>(s.n * s.k, 32);
    const auto r = at_team_sizes<std::vector<double>>([&] {
      std::vector<double> c(static_cast<size_t>(s.m * s.n), 1.0);
      ops::dgemm(false, true, s.m, s.n, s.k, 0.5, a.data(), s.k, b.data(), s.k, 2.0, c.data(), s.n);  // 0.5·A·Bᵀ + 2·C
      return c;
    });
    expect_all_equal(r);
    for (int64_t i = 0; i < s.m; i += 13)
      for (int64_t j = 0; j < s.n; j += 11) {
        double ref = 0;
        for (int64_t t = 0; t < s.k; ++t) ref += a[size_t(i * s.k + t)] * b[size_t(j * s.k + t)];
        // FP64, k ≤ 1024 terms of N(0,1)² magnitude: error ≪ 1e-10.
        ASSERT_NEAR(r[0][size_t(i * s.n + j)], 0.5 * ref + 2.0, 1e-10) << i << ", " << j;
      }
  }
}

}  // namespace
}  // namespace sq
