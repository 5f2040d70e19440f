// The element math of the CUDA quantized linears (lib/cuda/quant_element.h, __host__ __device__)
// run on the CPU against the CPU codecs and layers, on real stories260K weights and activations.
// These tests run on every machine: they are what is verified of the CUDA W8A8 / W4A16 paths
// where there is no GPU. The kernels call exactly these functions (in the replayed order), so the
// device tests (tests/cuda_linear_test.cpp) can demand bit-identical results.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "calib/q4k_quantize.h"
#include "cuda/cuda_int8_gemm.h"
#include "cuda/quant_element.h"
#include "formats/safetensors.h"
#include "model/w4a16_linear.h"
#include "model/w8a8_linear.h"
#include "quant/int4_quantize.h"
#include "quant/int8_gemm.h"
#include "quant/int8_quantize.h"
#include "support/linear_inputs.h"
#include "support/w4a16_replay.h"

namespace sq {
namespace {

constexpr double kU = 5.96e-8;  // FP32 unit roundoff 2^-24

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

TEST(CudaQuantElement, HalfDecodeMatchesCpuForEveryBitPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = qe::half_bits_to_float(uint16_t(h)), want = half_to_float(uint16_t(h));
    if (std::isnan(want)) ASSERT_TRUE(std::isnan(got)) << std::hex << h;
    else ASSERT_EQ(bits(got), bits(want)) << std::hex << h;  // ±0, subnormals, normals, ±inf: exact
  }
}

TEST(CudaQuantElement, PadInt8MatrixKeepsValuesAndZeroFills) {
  const std::vector<int8_t> q = {1, -2, 3, 127, -127, 0};  // [2, 3]
  const auto p = cuda::pad_int8_matrix(q.data(), 2, 3, 16, 16);
  ASSERT_EQ(p.size(), 256u);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) EXPECT_EQ(p[size_t(r * 16 + c)], (r < 2 && c < 3) ? q[size_t(r * 3 + c)] : 0) << r << "," << c;
  EXPECT_EQ(cuda::int8_gemm_pad(172), 176);
  EXPECT_EQ(cuda::int8_gemm_pad(64), 64);
  EXPECT_EQ(cuda::int8_gemm_pad(11008), 11008);
  EXPECT_THROW(cuda::pad_int8_matrix(q.data(), 2, 3, 1, 16), std::invalid_argument);
}

/// The device's activation quantizer replayed on the host: per-token / per-tensor absmax (exact
/// maxima), qe::int8_activation_step, qe::quantize_int8_value; scales [n] or [1].
void replay_quantize(const float* x, int64_t n, int64_t k, ActQuant mode, float static_step, std::vector<int8_t>& q,
                     std::vector<float>& scales) {
  q.assign(size_t(n * k), 0);
  scales.assign(size_t(act_scale_count(mode, n, k)), 0.0f);
  float all = 0.0f;
  for (int64_t i = 0; i < n * k; ++i) all = std::max(all, std::fabs(x[i]));
  for (int64_t i = 0; i < n; ++i) {
    float step = static_step;
    if (mode == ActQuant::PerToken) {
      float m = 0.0f;
      for (int64_t j = 0; j < k; ++j) m = std::max(m, std::fabs(x[i * k + j]));
      step = scales[size_t(i)] = qe::int8_activation_step(m);
    } else if (mode == ActQuant::PerTensorDynamic) {
      step = scales[0] = qe::int8_activation_step(all);
    } else {
      scales[0] = static_step;
    }
    for (int64_t j = 0; j < k; ++j) q[size_t(i * k + j)] = qe::quantize_int8_value(x[i * k + j], step);
  }
}

TEST(CudaQuantElement, Int8ActivationQuantizationIsBitIdenticalToCpuOnRealActivations) {
  const auto in = test::stories_linear_inputs(64);
  std::vector<float> x172 = in.x172;
  x172[5] = 0.0f;
  // Exact ties: with absmax 63.5 in row 1, Δ = 0.5 and x = 0.25 is q = 0.5 → 0 (half to even), 0.75 → 2.
  for (int64_t j = 0; j < 172; ++j) x172[size_t(172 + j)] = 0.0f;
  x172[172] = 63.5f;
  x172[173] = 0.25f;
  x172[174] = 0.75f;
  x172[175] = -0.25f;
  struct Case {
    const std::vector<float>* x;
    int64_t k;
  };
  for (const Case& c : {Case{&in.x64, 64}, Case{&x172, 172}})
    for (ActQuant mode : {ActQuant::PerToken, ActQuant::PerTensorDynamic, ActQuant::PerTensorStatic}) {
      // Static: a calibrated step smaller than most absmaxes, so clamping at ±127 happens.
      const float static_step = mode == ActQuant::PerTensorStatic ? 0.004f : 0.0f;
      std::vector<int8_t> qref(c.x->size()), q;
      std::vector<float> sref(size_t(act_scale_count(mode, in.n, c.k))), s;
      quantize_activations(c.x->data(), in.n, c.k, mode, static_step, qref.data(), sref.data());
      replay_quantize(c.x->data(), in.n, c.k, mode, static_step, q, s);
      EXPECT_EQ(s, sref) << to_string(mode) << " k " << c.k;
      EXPECT_EQ(q, qref) << to_string(mode) << " k " << c.k;
      if (mode == ActQuant::PerTensorStatic) {
        EXPECT_NE(std::count(q.begin(), q.end(), int8_t(127)) + std::count(q.begin(), q.end(), int8_t(-127)), 0);
      }
    }
  // The documented device behaviour for NaN/inf where the CPU throws: a NaN step; NaN codes → −127.
  EXPECT_TRUE(std::isnan(qe::int8_activation_step(INFINITY)));
  EXPECT_TRUE(std::isnan(qe::int8_activation_step(NAN)));
  EXPECT_EQ(qe::int8_activation_step(0.0f), 1.0f);
  EXPECT_EQ(qe::quantize_int8_value(NAN, 1.0f), -127);
}

/// The whole device W8A8 pipeline replayed on the host — padded weight (pad_int8_matrix), padded
/// activation codes, exact INT32 GEMM over the padded k, qe::int8_dequant — against
/// W8A8Linear::forward on the real stories260K weights: bit-identical for every mode, with and
/// without bias, for the ragged k = 172 and m = 172 (padded to 176).
TEST(CudaQuantElement, W8A8DevicePipelineReplayIsBitIdenticalToCpuLayer) {
  const auto in = test::stories_linear_inputs(64);
  struct Mode {
    WeightGranularity wg;
    ActQuant aq;
  };
  for (const test::WeightAndInput& sh : {test::WeightAndInput{&in.wq, &in.x64}, test::WeightAndInput{&in.wgate, &in.x64}, test::WeightAndInput{&in.wdown, &in.x172}})
    for (const Mode md : {Mode{WeightGranularity::PerChannel, ActQuant::PerToken}, Mode{WeightGranularity::PerTensor, ActQuant::PerTensorDynamic},
                          Mode{WeightGranularity::PerTensor, ActQuant::PerTensorStatic}, Mode{WeightGranularity::PerChannel, ActQuant::PerTensorStatic}})
      for (bool with_bias : {false, true}) {
        const int64_t m = sh.w->dim(0), k = sh.w->dim(1), mp = cuda::int8_gemm_pad(m), kp = cuda::int8_gemm_pad(k);
        Tensor bias;
        if (with_bias) {
          std::vector<float> b(static_cast<size_t>(m));
          for (int64_t j = 0; j < m; ++j) b[size_t(j)] = 0.01f * float(j % 13) - 0.05f;
          bias = Tensor::from_vector({m}, b);
        }
        const W8A8Linear layer(*sh.w, md.wg, md.aq, 0.02f, bias);
        for (int64_t n : {int64_t(1), int64_t(7), int64_t(64)}) {
          std::vector<float> yref(size_t(n * m));
          layer.forward(sh.x->data(), n, yref.data());
          std::vector<int8_t> xq;
          std::vector<float> xs;
          replay_quantize(sh.x->data(), n, k, md.aq, layer.static_step(), xq, xs);
          const std::vector<int8_t> wq = layer.quantized_weight();
          const auto wpad = cuda::pad_int8_matrix(wq.data(), m, k, mp, kp);
          const auto xpad = cuda::pad_int8_matrix(xq.data(), n, k, n, kp);
          std::vector<int32_t> acc(size_t(n * mp));
          int8_gemm_reference(xpad.data(), wpad.data(), acc.data(), n, mp, kp);
          const auto& ws = layer.weight_scales();
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < m; ++j) {
              const float sa = xs[md.aq == ActQuant::PerToken ? size_t(i) : 0];
              const float sb = ws[md.wg == WeightGranularity::PerChannel ? size_t(j) : 0];
              const float got = qe::int8_dequant(acc[size_t(i * mp + j)], sa, sb, with_bias, with_bias ? bias.data()[j] : 0.0f);
              ASSERT_EQ(bits(got), bits(yref[size_t(i * m + j)]))
                  << layer.format() << " bias " << with_bias << " n " << n << " at " << i << "," << j << ": " << got << " vs "
                  << yref[size_t(i * m + j)];
            }
        }
      }
}

TEST(CudaQuantElement, Int4DecodeMatchesCpuCodecOnRealWeights) {
  const auto in = test::stories_linear_inputs(1);
  for (const Tensor* w : {&in.wgate, &in.wdown})  // in = 64 and the ragged in = 172
    for (int64_t g : {32, 64, 128})
      for (bool asym : {false, true}) {
        const Int4Weights q = quantize_int4(w->data(), w->dim(0), w->dim(1), g, asym);
        std::vector<float> ref(size_t(q.out * q.in));
        dequantize_int4(q, ref.data());
        const int64_t G = int4_groups_per_row(q);
        for (int64_t r = 0; r < q.out; ++r)
          for (int64_t c = 0; c < q.in; ++c) {
            const unsigned nib = qe::nibble_at(q.packed.data() + r * (q.in / 2), c);
            ASSERT_EQ(qe::int4_value(nib, asym), int4_code(q, r, c)) << r << "," << c;
            if (asym) {
              ASSERT_EQ(int(qe::nibble_at(q.zeros_packed.data(), r * G + c / g)), int4_zero(q, r, c / g));
            }
            const float got = qe::int4_weight_at(q.packed.data(), q.scales_f16.data(), asym ? q.zeros_packed.data() : nullptr, nullptr,
                                                 q.in, g, G, asym, r, c);
            ASSERT_EQ(bits(got), bits(ref[size_t(r * q.in + c)])) << "g " << g << " asym " << asym << " at " << r << "," << c;
          }
      }
}

/// The default W4A16 layout (GGML's Q4_K, a float minimum per group of 32, Δ and m expanded from the
/// super-block heads): the device element decode equals dequantize_int4 bit for bit, and the kernels'
/// GEMV / GEMM orders stay within the rounding bound of the CPU layer, on real weights and activations
/// (in = 64 and the ragged 172: one short super-block per row).
TEST(CudaQuantElement, KQuantFloatMinimumDecodeAndReplaysMatchCpu) {
  const auto in = test::stories_linear_inputs(64);
  for (const test::WeightAndInput& sh : {test::WeightAndInput{&in.wgate, &in.x64}, test::WeightAndInput{&in.wdown, &in.x172}}) {
    const W4A16Linear layer(quantize_q4k(sh.w->data(), sh.w->dim(0), sh.w->dim(1), nullptr, "test"));
    const Int4Weights& q = layer.weights();
    ASSERT_TRUE(q.float_min() && q.k_quant());
    std::vector<float> ref(size_t(q.out * q.in));
    dequantize_int4(q, ref.data());
    const int64_t G = int4_groups_per_row(q);
    for (int64_t r = 0; r < q.out; ++r)
      for (int64_t c = 0; c < q.in; ++c) {
        const float got = qe::int4_weight_at(q.packed.data(), q.scales_f16.data(), nullptr, q.mins_f16.data(), q.in, q.group, G, true, r, c);
        ASSERT_EQ(bits(got), bits(ref[size_t(r * q.in + c)])) << "in " << q.in << " at " << r << "," << c;
      }
    for (int64_t n : {int64_t(1), int64_t(7)}) {
      const auto replay = test::replay_w4a16(q, sh.x->data(), n);
      std::vector<float> cpu(replay.size());
      layer.forward(sh.x->data(), n, cpu.data());
      const auto exact = test::w4a16_exact(q, sh.x->data(), n);
      const double gamma = double(q.in + 16) * kU;  // as the test below (w4a16_replay.h)
      for (size_t i = 0; i < cpu.size(); ++i) {
        const double M = exact.magnitude[i];
        ASSERT_LE(std::fabs(replay[i] - exact.value[i]), gamma * M + 1e-30) << "in " << q.in << " n " << n << " at " << i;
        ASSERT_LE(std::fabs(double(replay[i]) - cpu[i]), 2 * gamma * M + 1e-30) << "in " << q.in << " n " << n << " at " << i;
      }
    }
  }
}

/// The GEMV / GEMM orders of the W4A16 kernels replayed on the CPU against W4A16Linear::forward
/// and the exact (double) product, on real weights and activations; the same bounds the device
/// test uses, so a failure there that does not show here is a kernel bug, not a bound problem.
TEST(CudaQuantElement, W4A16KernelReplaysMatchCpuLayerWithinRoundingBound) {
  const auto in = test::stories_linear_inputs(64);
  double worst_ratio = 0, worst_nmse = 0;
  for (const test::WeightAndInput& sh : {test::WeightAndInput{&in.wq, &in.x64}, test::WeightAndInput{&in.wgate, &in.x64}, test::WeightAndInput{&in.wdown, &in.x172}})
    for (int64_t g : {32, 64, 128})
      for (bool asym : {false, true}) {
        const W4A16Linear layer(*sh.w, g, asym);
        const Int4Weights& w = layer.weights();
        for (int64_t n : {int64_t(1), int64_t(7)}) {
          const auto replay = test::replay_w4a16(w, sh.x->data(), n);
          std::vector<float> cpu(replay.size());
          layer.forward(sh.x->data(), n, cpu.data());
          const auto exact = test::w4a16_exact(w, sh.x->data(), n);
          // Each FP32 evaluation is within (in + 16)·u·M of the exact value (w4a16_replay.h: fma
          // chains of ≤ in terms, the CPU's per-group partial sums with ≤ in + G + 2 roundings),
          // so two of them differ by at most twice that.
          const double gamma = double(w.in + 16) * kU;
          for (size_t i = 0; i < cpu.size(); ++i) {
            const double M = exact.magnitude[i];
            ASSERT_LE(std::fabs(replay[i] - exact.value[i]), gamma * M + 1e-30) << layer.format() << " n " << n << " at " << i;
            ASSERT_LE(std::fabs(double(replay[i]) - cpu[i]), 2 * gamma * M + 1e-30) << layer.format() << " n " << n << " at " << i;
            if (M > 0) worst_ratio = std::max(worst_ratio, std::fabs(double(replay[i]) - cpu[i]) / (kU * M));
          }
          // The device test's normalized-MSE bound (relative RMS error ~(in + 16)·u ≈ 1e-5 ⇒ < 1e-9).
          double num = 0, den = 0;
          for (size_t i = 0; i < cpu.size(); ++i) {
            num += (double(replay[i]) - cpu[i]) * (double(replay[i]) - cpu[i]);
            den += double(cpu[i]) * cpu[i];
          }
          EXPECT_LT(num / den, 1e-9) << layer.format() << " n " << n;
          worst_nmse = std::max(worst_nmse, num / den);
        }
      }
  // For the record: the largest |replay − CPU| seen, in units of u·M (the bound allows 2·(in + 16)).
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g", worst_ratio);
  RecordProperty("worst_diff_in_u_M", buf);
  std::snprintf(buf, sizeof buf, "%.3g", worst_nmse);
  RecordProperty("worst_nmse", buf);
}

}  // namespace
}  // namespace sq
