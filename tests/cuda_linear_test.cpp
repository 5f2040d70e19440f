// Device linears (lib/cuda/cuda_linear.h) against the host layers' Linear::forward on the real
// stories260K weights and activations, for every supported format and n ∈ {1, 7, 64}; the parts of
// the W8A8 path (activation quantization, cuBLASLt INT8 GEMM) on their own. Every test that needs a
// device skips without one; the refusal of unsupported formats runs everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "calib/q4k_quantize.h"
#include "core/error.h"
#include "cuda/cuda_int8_gemm.h"
#include "cuda/cuda_int8_quantize.h"
#include "cuda/cuda_linear.h"
#include "cuda/cuda_runtime.h"
#include "model/linear.h"
#include "model/w4a16_linear.h"
#include "model/w4a4_linear.h"
#include "model/w8a8_linear.h"
#include "quant/int8_gemm.h"
#include "quant/int8_quantize.h"
#include "support/linear_inputs.h"
#include "support/w4a16_replay.h"

namespace sq {
namespace {

#define SQ_REQUIRE_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

constexpr double kU = 5.96e-8;  // FP32 unit roundoff 2^-24

/// Σ(a−b)² / Σb².
double nmse(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? num / den : num;
}

/// Runs `layer` on the device for the first n rows of x [*, in]: upload, forward on a stream,
/// download y [n, out].
std::vector<float> device_forward(const Linear& layer, const std::vector<float>& x, int64_t n, const std::string& name) {
  auto dev = cuda::upload_linear(layer, name);
  EXPECT_EQ(dev->format(), layer.format());
  EXPECT_EQ(dev->in_features(), layer.in_features());
  EXPECT_EQ(dev->out_features(), layer.out_features());
  CudaStream stream;
  DeviceArray<float> dx(x.data(), size_t(n * layer.in_features())), dy(size_t(n * layer.out_features()));
  dev->forward(dx.data(), n, dy.data(), stream.get());
  stream.synchronize();
  return dy.to_host();
}

Tensor test_bias(int64_t m) {
  std::vector<float> b(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j) b[size_t(j)] = 0.01f * float(j % 13) - 0.05f;
  return Tensor::from_vector({m}, b);
}

struct Shape {
  const char* name;
  const Tensor* w;
  const std::vector<float>* x;
};

std::vector<Shape> shapes(const test::StoriesLinearInputs& in) {
  return {{"q_proj [64, 64]", &in.wq, &in.x64},
          {"gate_proj [172, 64]", &in.wgate, &in.x64},
          {"down_proj [64, 172]", &in.wdown, &in.x172},
          {"lm_head [512, 64]", &in.whead, &in.x64}};
}

constexpr int64_t kRowCounts[] = {1, 7, 64};

TEST(CudaLinear, UnsupportedFormatIsRefusedByNameOnEveryMachine) {
  const auto in = test::stories_linear_inputs(1);
  const W4A4Linear atom(in.wq, 0, 32);
  try {
    cuda::upload_linear(atom, "layer 2 o_proj");
    FAIL() << "a W4A4 (Atom) linear was uploaded";
  } catch (const UnsupportedError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layer 2 o_proj"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'" + atom.format() + "'"), std::string::npos) << msg;
  }
}

TEST(CudaLinear, DenseMatchesCpuWithinSummationBound) {
  SQ_REQUIRE_CUDA();
  const auto in = test::stories_linear_inputs(64);
  for (const Shape& sh : shapes(in))
    for (bool with_bias : {false, true}) {
      const DenseLinear layer(*sh.w, with_bias ? test_bias(sh.w->dim(0)) : Tensor{});
      const int64_t m = sh.w->dim(0), k = sh.w->dim(1);
      for (int64_t n : kRowCounts) {
        std::vector<float> ref(size_t(n * m));
        layer.forward(sh.x->data(), n, ref.data());
        const auto got = device_forward(layer, *sh.x, n, sh.name);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < m; ++j) {
            double mag = with_bias ? std::fabs(layer.bias().data()[j]) : 0.0;
            for (int64_t c = 0; c < k; ++c) mag += std::fabs(double((*sh.x)[size_t(i * k + c)]) * sh.w->data()[j * k + c]);
            // cuBLAS and OpenBLAS each sum k products (+ bias) in FP32, in different orders: each is
            // within γ_{k+1}·Σ|x||w| of the exact value (Higham Eq. 3.5), so they differ by ≤ 2·γ_{k+1}·Σ|x||w|.
            ASSERT_NEAR(got[size_t(i * m + j)], ref[size_t(i * m + j)], 2.0 * double(k + 2) * kU * mag + 1e-30)
                << sh.name << " bias " << with_bias << " n " << n << " at " << i << "," << j;
          }
      }
    }
}

TEST(CudaLinear, Int8ActivationQuantizationIsBitIdenticalAndZeroPadded) {
  SQ_REQUIRE_CUDA();
  const auto in = test::stories_linear_inputs(64);
  const int64_t n = 64, k = 172, ldq = cuda::int8_gemm_pad(k);
  for (ActQuant mode : {ActQuant::PerToken, ActQuant::PerTensorDynamic, ActQuant::PerTensorStatic}) {
    const float static_step = mode == ActQuant::PerTensorStatic ? 0.004f : 0.0f;  // clamps some values
    std::vector<int8_t> qref(size_t(n * k));
    std::vector<float> sref(size_t(act_scale_count(mode, n, k)));
    quantize_activations(in.x172.data(), n, k, mode, static_step, qref.data(), sref.data());
    DeviceArray<float> dx(in.x172), ds(sref.size());
    DeviceArray<int8_t> dq(size_t(n * ldq));
    std::vector<int8_t> junk(size_t(n * ldq), int8_t(99));  // the padding must be overwritten with 0
    dq.upload(junk.data(), junk.size());
    cuda::quantize_activations_int8(dx.data(), n, k, mode, static_step, dq.data(), ldq, ds.data());
    const auto q = dq.to_host();
    // absmax is exact, Δ and x/Δ are single IEEE divisions, the rounding is half-to-even on both
    // sides (cuda/quant_element.h, replayed against the CPU in cuda_quant_element_test): identical.
    EXPECT_EQ(ds.to_host(), sref) << to_string(mode);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < ldq; ++j)
        ASSERT_EQ(int(q[size_t(i * ldq + j)]), j < k ? int(qref[size_t(i * k + j)]) : 0) << to_string(mode) << " at " << i << "," << j;
  }
}

TEST(CudaLinear, CublasLtInt8GemmIsExact) {
  SQ_REQUIRE_CUDA();
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> d(-127, 127);
  // k = 4096 at full magnitude exercises large accumulators (|acc| up to 127²·4096 ≈ 6.6e7).
  for (auto [m, k] : {std::pair<int64_t, int64_t>{172, 172}, {64, 4096}, {512, 64}}) {
    const int64_t mp = cuda::int8_gemm_pad(m), kp = cuda::int8_gemm_pad(k);
    std::vector<int8_t> w(size_t(m * k));
    for (auto& v : w) v = int8_t(d(rng));
    const auto wpad = cuda::pad_int8_matrix(w.data(), m, k, mp, kp);
    cuda::CublasLtInt8Gemm gemm(mp, kp);
    DeviceArray<int8_t> dw(wpad);
    DeviceBuffer workspace(cuda::kLtWorkspaceBytes);
    for (int64_t n : kRowCounts) {
      std::vector<int8_t> x(size_t(n * k));
      for (auto& v : x) v = int8_t(d(rng));
      const auto xpad = cuda::pad_int8_matrix(x.data(), n, k, n, kp);
      std::vector<int32_t> ref(size_t(n * m));
      int8_gemm_reference(x.data(), w.data(), ref.data(), n, m, k);
      DeviceArray<int8_t> dx(xpad);
      DeviceArray<int32_t> dacc(size_t(n * mp));
      gemm.run(dw.data(), dx.data(), n, dacc.data(), workspace.data(), workspace.bytes());
      const auto acc = dacc.to_host();
      // Integer sums are exact: every accumulator must equal the reference, and the padded output
      // channels (zero weight rows) must be 0.
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < mp; ++j)
          ASSERT_EQ(acc[size_t(i * mp + j)], j < m ? ref[size_t(i * m + j)] : 0)
              << "m " << m << " k " << k << " n " << n << " at " << i << "," << j
              << " (a transposed result means the TN layout / leading dimensions are wrong)";
    }
  }
  EXPECT_THROW(cuda::CublasLtInt8Gemm(172, 176), std::invalid_argument);  // m not padded
}

TEST(CudaLinear, W8A8MatchesCpuBitForBit) {
  SQ_REQUIRE_CUDA();
  const auto in = test::stories_linear_inputs(64);
  struct Mode {
    WeightGranularity wg;
    ActQuant aq;
  };
  for (const Shape& sh : shapes(in))
    for (const Mode md : {Mode{WeightGranularity::PerChannel, ActQuant::PerToken},
                          Mode{WeightGranularity::PerTensor, ActQuant::PerTensorDynamic},
                          Mode{WeightGranularity::PerTensor, ActQuant::PerTensorStatic}})
      for (bool with_bias : {false, true}) {
        const W8A8Linear layer(*sh.w, md.wg, md.aq, 0.02f, with_bias ? test_bias(sh.w->dim(0)) : Tensor{});
        for (int64_t n : kRowCounts) {
          std::vector<float> ref(size_t(n * sh.w->dim(0)));
          layer.forward(sh.x->data(), n, ref.data());
          const auto got = device_forward(layer, *sh.x, n, sh.name);
          // Same INT8 codes and steps, exact INT32 sums, and the same two float operations in the
          // epilogue (s = sa·sb, then fma or multiply): the outputs are bit-identical. A mismatch
          // means a step, a code or an accumulator differs (see the CudaLinear.Int8* tests).
          for (size_t i = 0; i < ref.size(); ++i)
            ASSERT_EQ(got[i], ref[i]) << sh.name << " " << layer.format() << " bias " << with_bias << " n " << n << " at " << i;
        }
      }
  // n = 0 is a no-op; a negative n is refused.
  const W8A8Linear layer(in.wq, WeightGranularity::PerChannel, ActQuant::PerToken);
  auto dev = cuda::upload_linear(layer, "q");
  EXPECT_NO_THROW(dev->forward(nullptr, 0, nullptr));
  EXPECT_THROW(dev->forward(nullptr, -1, nullptr), std::invalid_argument);
}

TEST(CudaLinear, W4A16MatchesKernelReplayExactlyAndCpuWithinRoundingBound) {
  SQ_REQUIRE_CUDA();
  const auto in = test::stories_linear_inputs(64);
  const auto check = [&](const W4A16Linear& layer, const Shape& sh) {
    const Int4Weights& w = layer.weights();
    for (int64_t n : kRowCounts) {
      const auto got = device_forward(layer, *sh.x, n, sh.name);
      // 1. The kernels evaluate qe::int4_row_partial_dot in the order the replay reproduces
      //    (GEMV: 32 lanes + butterfly; GEMM: sequential fma): bit-identical.
      const auto replay = test::replay_w4a16(w, sh.x->data(), n);
      for (size_t i = 0; i < replay.size(); ++i)
        ASSERT_EQ(got[i], replay[i]) << sh.name << " " << layer.format() << " n " << n << " at " << i
                                     << (n == 1 ? " (GEMV kernel)" : " (GEMM kernel)");
      // 2. Against the CPU layer: both are FP32 evaluations within (in + 16)·u·M of the exact
      //    product (w4a16_replay.h), so they differ by at most twice that.
      std::vector<float> ref(got.size());
      layer.forward(sh.x->data(), n, ref.data());
      const auto exact = test::w4a16_exact(w, sh.x->data(), n);
      const double gamma = double(w.in + 16) * kU;
      for (size_t i = 0; i < ref.size(); ++i)
        ASSERT_LE(std::fabs(double(got[i]) - ref[i]), 2 * gamma * exact.magnitude[i] + 1e-30)
            << sh.name << " " << layer.format() << " n " << n << " at " << i;
      // Relative RMS error ≤ ~(in + 16)·u ≈ 1e-5 per element ⇒ normalized MSE well below 1e-9.
      EXPECT_LT(nmse(got, ref), 1e-9) << sh.name << " " << layer.format() << " n " << n;
    }
  };
  // g = 128 > in = 64 is one ragged group per row; in = 172 leaves ragged last groups of 12 (g 32),
  // 44 (g 64 and 128).
  for (const Shape& sh : shapes(in)) {
    for (int64_t g : {32, 64, 128})
      for (bool asym : {false, true}) check(W4A16Linear(*sh.w, g, asym), sh);
    // the default layout, GGML's Q4_K: a float minimum per group (Δ and m expanded from the super-block heads)
    check(W4A16Linear(quantize_q4k(sh.w->data(), sh.w->dim(0), sh.w->dim(1), nullptr, sh.name)), sh);
  }
}

}  // namespace
}  // namespace sq
