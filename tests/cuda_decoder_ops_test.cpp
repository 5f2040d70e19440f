// The generic decoder's CUDA ops (lib/cuda/cuda_ops.h: norm, activation, gated_activation, partial
// rope, attention with AttentionOptions, gather_rows / scatter_add_rows / fill) and the per-layer
// RoPE of CudaKVCache (partial rotary, per-layer θ, attend with options).
//
// CudaDecoderElement.* run on every machine (no device): the element math of
// cuda/decoder_element.h, which the kernels call, against lib/ops (activations bit-identical; norm
// elements with the row factors the kernel's block reductions produce, replayed on the host), a
// host replay of the attention kernel built only from decoder_element.h functions against a
// double-precision attention written from Decoder::attention's definition (scale, sliding window,
// ALiBi, GQA), and kvdev::rope_channel_pair (the KV kernels' partial-rotary pairs) against
// ops::rope's rot_dim overload.
//
// CudaDecoderOps.* and CudaDecoderKV.* need a device (skipped otherwise): every new op against the
// CPU ops or a double-precision reference, and CudaKVCache::attend with options on partial-rotary /
// local-θ / sliding-window and ALiBi configurations against the CPU KVCache's rows.
// Tolerances: u = 2^-24 ≈ 6e-8 is the FP32 unit roundoff; each bound is justified where it is used.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/model_config.h"
#include "core/rope_frequencies.h"
#include "cuda/cuda_kv_cache.h"
#include "cuda/cuda_ops.h"
#include "cuda/cuda_runtime.h"
#include "cuda/decoder_element.h"
#include "cuda/kv_device_math.h"
#include "ops/fast_exp.h"
#include "ops/ops.h"
#include "quant/kv_codec.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_format.h"

namespace sq {
namespace {

constexpr double kU = 5.96e-8;  // FP32 unit roundoff 2^-24
constexpr int kRowThreads = 256;  // threads per row block of cuda_ops.cu's norm kernel

#define SQ_REQUIRE_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// Same bits, or both NaN (NaN payloads are not part of the contract).
bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits_of(a) == bits_of(b); }

const char* act_name(Activation a) { return activation_name(a); }

constexpr Activation kActivations[] = {Activation::SiLU, Activation::GeluTanh, Activation::Gelu, Activation::ReLU};

float de_activate(Activation a, float x) {
  switch (a) {
    case Activation::SiLU: return de::silu(x);
    case Activation::GeluTanh: return de::gelu_tanh(x);
    case Activation::Gelu: return de::gelu_erf(x);
    case Activation::ReLU: return de::relu(x);
  }
  return 0.0f;
}

/// Inputs for the activations: a fine grid over [−100, 100], random values, and the extremes
/// (±0, subnormals, ±1e3 … ±FLT_MAX, ±inf, NaN).
std::vector<float> activation_inputs() {
  std::vector<float> x;
  for (int i = -20000; i <= 20000; ++i) x.push_back(static_cast<float>(i) * 0.005f);
  for (const float v : uniform(20000, -40.0f, 40.0f, 77)) x.push_back(v);
  const float big[] = {0.0f, 1e-40f, 1e-30f, 1e-7f, 87.0f, 88.5f, 89.0f, 100.0f, 1e3f, 1e4f, 1e10f, 1e30f,
                       std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity()};
  for (const float v : big) {
    x.push_back(v);
    x.push_back(-v);
  }
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  return x;
}

// ---- host replays of the kernels' reductions -------------------------------------------------------------

/// block_reduce / block_sum_double of cuda_ops.cu for one value per thread of a 256-thread block:
/// xor butterflies within each warp (lane l adds lane l ^ off, off = 16 … 1), then warp 0 does the
/// same over the warps' sums (lanes ≥ warps contribute 0).
template <typename T>
T replay_block_sum(const std::vector<T>& per_thread) {
  auto butterfly = [](std::array<T, 32> v) {
    for (int off = 16; off > 0; off >>= 1) {
      std::array<T, 32> w;
      for (int l = 0; l < 32; ++l) w[size_t(l)] = v[size_t(l)] + v[size_t(l ^ off)];
      v = w;
    }
    return v[0];
  };
  const int warps = static_cast<int>(per_thread.size()) / 32;
  std::array<T, 32> partial{};
  for (int w = 0; w < warps; ++w) {
    std::array<T, 32> lanes;
    for (int l = 0; l < 32; ++l) lanes[size_t(l)] = per_thread[size_t(w * 32 + l)];
    partial[size_t(w)] = butterfly(lanes);
  }
  return butterfly(partial);
}

/// cuda::norm's output for one row, computed on the host the way the kernel combines it: per-thread
/// sums over channels t, t + 256, … with the decoder_element.h steps, the block reduction above,
/// then the element expression.
void replay_norm_row(NormKind kind, const float* x, const float* w, const float* b, float* y, int d, float eps) {
  if (kind == NormKind::LayerNorm) {
    std::vector<double> s(kRowThreads, 0.0), sq(kRowThreads, 0.0);
    for (int t = 0; t < kRowThreads; ++t)
      for (int j = t; j < d; j += kRowThreads) s[size_t(t)] = de::addd(s[size_t(t)], double(x[j]));
    const double mean = de::ln_mean(replay_block_sum(s), d);
    for (int t = 0; t < kRowThreads; ++t)
      for (int j = t; j < d; j += kRowThreads) sq[size_t(t)] = de::ln_var_step(sq[size_t(t)], x[j], mean);
    const float inv = de::ln_inv_std(replay_block_sum(sq), d, eps);
    const float m = static_cast<float>(mean);
    for (int j = 0; j < d; ++j) y[j] = de::layer_norm_elem(x[j], m, inv, w[j], b ? b[j] : 0.0f);
  } else {
    std::vector<float> ss(kRowThreads, 0.0f);
    for (int t = 0; t < kRowThreads; ++t)
      for (int j = t; j < d; j += kRowThreads) ss[size_t(t)] = de::rms_sum_step(ss[size_t(t)], x[j]);
    const float inv = de::rms_inv_from_sum(replay_block_sum(ss), d, eps);
    for (int j = 0; j < d; ++j) y[j] = de::rms_norm_elem(x[j], inv, w[j]);
  }
}

/// cuda::attention's kernel replayed on the host with decoder_element.h only: per (query i, head h),
/// keys lo … p in tiles of head_dim, each score a sequential fused dot then attention_score, the
/// tile folded into the running (max, denominator, per-channel accumulator).
std::vector<float> replay_attention(const std::vector<float>& q, const std::vector<float>& K, const std::vector<float>& V, int64_t n,
                                    int64_t p0, int heads, int kv_heads, int hd, float scale, int window,
                                    const std::vector<float>& slopes) {
  const int64_t qw = int64_t(heads) * hd, kvw = int64_t(kv_heads) * hd;
  const int group = heads / kv_heads;
  std::vector<float> out(static_cast<size_t>(n * qw));
  std::vector<float> s(static_cast<size_t>(hd)), acc(static_cast<size_t>(hd));
  for (int64_t i = 0; i < n; ++i)
    for (int h = 0; h < heads; ++h) {
      const int g = h / group;
      const float* qh = q.data() + i * qw + int64_t(h) * hd;
      const int64_t pos = p0 + i, visible = pos + 1, lo = de::first_visible_key(pos, window);
      const float slope = slopes.empty() ? 0.0f : slopes[size_t(h)];
      float m = -INFINITY, l = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t t0 = lo; t0 < visible; t0 += hd) {
        const int cnt = static_cast<int>(std::min<int64_t>(visible - t0, hd));
        float tmax = -INFINITY;
        for (int jj = 0; jj < cnt; ++jj) {
          const int64_t j = t0 + jj;
          const float* k = K.data() + j * kvw + int64_t(g) * hd;
          float dot = 0.0f;
          for (int e = 0; e < hd; ++e) dot = de::dot_step(dot, qh[e], k[e]);
          s[size_t(jj)] = de::attention_score(dot, scale, slope, pos - j);
          tmax = std::fmax(tmax, s[size_t(jj)]);
        }
        const float m_new = std::fmax(m, tmax);
        const float corr = de::softmax_rescale(m, m_new);
        l = de::mul(l, corr);
        for (int d = 0; d < hd; ++d) acc[size_t(d)] = de::mul(acc[size_t(d)], corr);
        for (int jj = 0; jj < cnt; ++jj) {
          const float p = de::softmax_weight(s[size_t(jj)], m_new);
          l = de::add(l, p);
          const float* v = V.data() + (t0 + jj) * kvw + int64_t(g) * hd;
          for (int d = 0; d < hd; ++d) acc[size_t(d)] = de::sq_fma(p, v[d], acc[size_t(d)]);
        }
        m = m_new;
      }
      for (int d = 0; d < hd; ++d) out[size_t(i * qw + h * hd + d)] = de::div(acc[size_t(d)], l);
    }
  return out;
}

/// Attention from Decoder::attention's definition in double: query i at position p = p0 + i sees
/// keys j with j ≤ p and (window == 0 or j > p − window), score scale·(q·k) − slope_h·(p − j),
/// softmax, weighted values. K, V: [p0 + n, kv_heads·hd] rows (keys rotated). Also returns the
/// largest scale·Σ_e |q_e·k_e| (`terms`) and |slope·(p − j)| (`bias`) over the visible keys, and the
/// largest |v| (`vmax`), for the error bounds.
struct Reference {
  std::vector<double> out;
  double terms = 0, bias = 0, vmax = 0;
};
Reference reference_attention(const float* q, const float* K, const float* V, int64_t n, int64_t p0, int heads, int kv_heads, int hd,
                              float scale, int window, const std::vector<float>& slopes) {
  const int64_t qw = int64_t(heads) * hd, kvw = int64_t(kv_heads) * hd;
  const int group = heads / kv_heads;
  Reference r;
  r.out.assign(static_cast<size_t>(n * qw), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int h = 0; h < heads; ++h) {
      const int g = h / group;
      const int64_t pos = p0 + i;
      std::vector<int64_t> keys;
      for (int64_t j = 0; j <= pos; ++j)
        if (window == 0 || j > pos - window) keys.push_back(j);
      std::vector<double> s(keys.size());
      double mx = -1e300;
      for (size_t kk = 0; kk < keys.size(); ++kk) {
        const int64_t j = keys[kk];
        double dot = 0, abs = 0;
        for (int e = 0; e < hd; ++e) {
          const double t = double(q[i * qw + h * hd + e]) * double(K[j * kvw + g * hd + e]);
          dot += t;
          abs += std::fabs(t);
        }
        const double bias = slopes.empty() ? 0.0 : double(slopes[size_t(h)]) * double(pos - j);
        s[kk] = double(scale) * dot - bias;
        r.terms = std::max(r.terms, double(scale) * abs);
        r.bias = std::max(r.bias, std::fabs(bias));
        mx = std::max(mx, s[kk]);
      }
      double z = 0;
      for (auto& e : s) z += (e = std::exp(e - mx));
      for (size_t kk = 0; kk < keys.size(); ++kk)
        for (int e = 0; e < hd; ++e) {
          const double v = V[keys[kk] * kvw + g * hd + e];
          r.vmax = std::max(r.vmax, std::fabs(v));
          r.out[size_t(i * qw + h * hd + e)] += s[kk] / z * v;
        }
    }
  return r;
}

/// Bound on |computed − exact| of an FP32 attention output (kernel or replay) against the double
/// reference. Scores: the fused dot over hd terms is off by ≤ hd·u·Σ|q·k|, the scale, ALiBi product
/// and subtraction add ≤ u·(|score| + 2·|bias|): per score ≤ (hd + 3)·u·T + 3u·B (T = terms,
/// B = bias). The softmax weights then move by ≤ 2× that relative (numerator and normalizer), plus
/// the exponentials (≤ 2 ulp each), the running sums over ≤ L keys and the online rescaling (≤ L + 16
/// roundings of u); the output, a convex combination of values, moves by ≤ vmax times the sum.
/// `extra_key_rel`: relative error of the keys themselves (KV rotation / dequantization).
double attention_bound(const Reference& r, int hd, int64_t L, double extra_key_rel = 0) {
  return r.vmax * (2.0 * ((hd + 8) * kU + extra_key_rel) * r.terms + 6.0 * kU * r.bias + (L + 16) * kU) + 1e-30;
}

/// ALiBi slopes of Press et al. (2022) for a power-of-two head count: 2^(−8(h+1)/H).
std::vector<float> alibi_slopes(int heads) {
  std::vector<float> s(static_cast<size_t>(heads));
  for (int h = 0; h < heads; ++h) s[size_t(h)] = static_cast<float>(std::pow(2.0, -8.0 * (h + 1) / heads));
  return s;
}

struct AttentionCase {
  const char* name;
  float scale;  ///< 0 = 1/√hd
  int window;
  bool alibi;
};
constexpr AttentionCase kAttentionCases[] = {
    {"plain", 0.0f, 0, false},        {"scale 0.3", 0.3f, 0, false},       {"window 16", 0.0f, 16, false},
    {"window 1", 0.0f, 1, false},     {"alibi", 0.0f, 0, true},            {"alibi + window 7", 0.0f, 7, true},
    {"scale + window + alibi", 0.125f, 33, true}, {"window past the context", 0.0f, 1000, false},
};

// ---- CPU tests: decoder_element.h against lib/ops ---------------------------------------------------------

TEST(CudaDecoderElement, ActivationsAreBitIdenticalToOps) {
  const std::vector<float> x = activation_inputs();
  for (const Activation a : kActivations) {
    SCOPED_TRACE(act_name(a));
    std::vector<float> ref = x;
    ops::activation(a, ref.data(), static_cast<int64_t>(ref.size()));
    // The same expressions (SiLU / GeluTanh through the same fast_exp polynomial, Gelu through the
    // same std::erf call, ReLU a comparison), evaluated without contraction on both sides: equal
    // bits for every input, the large and non-finite ones included.
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_TRUE(same_float(de_activate(a, x[i]), ref[i])) << "x = " << x[i] << ": " << de_activate(a, x[i]) << " vs " << ref[i];
  }
  // fast_exp itself, over its whole clamped range and beyond.
  for (const float v : x) ASSERT_TRUE(same_float(de::fast_exp(v), ops::fast_exp(v))) << v;
}

TEST(CudaDecoderElement, GatedActivationsAreBitIdenticalToOps) {
  const std::vector<float> g = activation_inputs();
  std::vector<float> u = uniform(g.size(), -3.0f, 3.0f, 78);
  u[0] = 0.0f;
  u[1] = std::numeric_limits<float>::infinity();
  for (const Activation a : kActivations) {
    SCOPED_TRACE(act_name(a));
    std::vector<float> ref = g;
    ops::gated_activation(a, ref.data(), u.data(), static_cast<int64_t>(ref.size()));
    // act(g)·u with one rounded product (SiLU: ops::swiglu's g / (1 + e^−g) * up, the same value).
    for (size_t i = 0; i < g.size(); ++i) ASSERT_TRUE(same_float(de::gated(de_activate(a, g[i]), u[i]), ref[i])) << "g = " << g[i];
  }
  std::vector<float> sw = g;
  ops::swiglu(sw.data(), u.data(), static_cast<int64_t>(sw.size()));
  for (size_t i = 0; i < g.size(); ++i) ASSERT_TRUE(same_float(de::gated(de::silu(g[i]), u[i]), sw[i])) << g[i];
}

TEST(CudaDecoderElement, NormElementsWithKernelReductionsMatchOps) {
  const float eps = 1e-5f;
  int row = 0;
  for (const int d : {1, 5, 64, 288, 1000, 3000}) {
    for (const float offset : {0.0f, 3.0f, 1000.0f}) {
      const int64_t n = 3;
      std::vector<float> x = uniform(size_t(n * d), -2.0f, 2.0f, 100u + uint32_t(row++));
      for (auto& v : x) v += offset;
      const auto w = uniform(size_t(d), 0.5f, 1.5f, 200u + uint32_t(d)), b = uniform(size_t(d), -0.5f, 0.5f, 300u + uint32_t(d));
      SCOPED_TRACE("d " + std::to_string(d) + " offset " + std::to_string(offset));
      // LayerNorm: the kernel's double-precision sums differ from the CPU's sequential ones by
      // ~1e−16 relative, far below FP32 rounding, so its FP32 mean and inverse std are the CPU's and
      // the element expression (the same operations) gives the same bits, with and without bias.
      for (const float* bias : {b.data(), static_cast<const float*>(nullptr)}) {
        std::vector<float> ref(x.size()), got(x.size());
        ops::layer_norm(x.data(), w.data(), bias, ref.data(), n, d, eps);
        for (int64_t t = 0; t < n; ++t) replay_norm_row(NormKind::LayerNorm, x.data() + t * d, w.data(), bias, got.data() + t * d, d, eps);
        for (size_t i = 0; i < ref.size(); ++i) ASSERT_TRUE(same_float(got[i], ref[i])) << (bias ? "bias " : "no bias ") << i;
      }
      // RMSNorm: both sums of squares are within γ_d ≈ d·u of the exact one (nonnegative terms, any
      // order), so the factors differ by ≤ d·u + 8u (half of it through the square root, plus the
      // roundings of ss/d + eps, sqrt and the division on each side) and each output by that plus
      // its two products on each side: (d + 16)·u relative.
      std::vector<float> ref(x.size()), got(x.size());
      ops::rms_norm(x.data(), w.data(), ref.data(), n, d, eps);
      for (int64_t t = 0; t < n; ++t) replay_norm_row(NormKind::RMSNorm, x.data() + t * d, w.data(), nullptr, got.data() + t * d, d, eps);
      for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], (d + 16) * kU * std::fabs(ref[i]) + 1e-30) << i;
    }
  }
}

TEST(CudaDecoderElement, ScoreAndWindowRules) {
  // first_visible_key: p − window < j ≤ p.
  EXPECT_EQ(de::first_visible_key(10, 0), 0);
  EXPECT_EQ(de::first_visible_key(10, 4), 7);   // keys 7, 8, 9, 10
  EXPECT_EQ(de::first_visible_key(10, 1), 10);  // itself only
  EXPECT_EQ(de::first_visible_key(2, 4), 0);
  EXPECT_EQ(de::first_visible_key(3, 4), 0);
  EXPECT_EQ(de::first_visible_key(4, 4), 1);
  // Without ALiBi (slope 0) the score is exactly scale·dot, signed zeros and NaN included.
  for (const float dot : {1.5f, -0.0f, 0.0f, -3e30f, 7e-39f, std::numeric_limits<float>::infinity()})
    for (const int64_t dist : {int64_t(0), int64_t(5), int64_t(100000)})
      ASSERT_TRUE(same_float(de::attention_score(dot, 0.125f, 0.0f, dist), 0.125f * dot)) << dot << " " << dist;
  EXPECT_TRUE(std::isnan(de::attention_score(NAN, 0.5f, 0.0f, 3)));
  // With ALiBi: Decoder::attention's S = scale·dot, then S −= slope·float(p − j), compiled to one
  // fused multiply-add.
  const float s = 0.3f * 2.7f;
  EXPECT_EQ(bits_of(de::attention_score(2.7f, 0.3f, 0.0625f, 17)), bits_of(std::fma(-0.0625f, 17.0f, s)));
  EXPECT_EQ(bits_of(de::attention_score(2.7f, 0.3f, 0.01f, 33)), bits_of(std::fma(-0.01f, 33.0f, s)));
  // softmax_rescale from −inf is 0 (the first tile), weights e^(s − m).
  EXPECT_EQ(de::softmax_rescale(-INFINITY, 1.0f), 0.0f);
  EXPECT_EQ(de::softmax_weight(2.0f, 2.0f), 1.0f);
}

TEST(CudaDecoderElement, AttentionReplayMatchesDoublePrecisionReference) {
  const int heads = 8, kv_heads = 2, hd = 32;
  const std::vector<float> slopes = alibi_slopes(heads);
  for (auto [n, p0] : {std::pair<int64_t, int64_t>{70, 40}, {1, 109}, {5, 0}}) {
    const int64_t L = p0 + n;
    const auto q = uniform(size_t(n * heads * hd), -1, 1, 12), K = uniform(size_t(L * kv_heads * hd), -1, 1, 13),
               V = uniform(size_t(L * kv_heads * hd), -1, 1, 14);
    for (const AttentionCase& ac : kAttentionCases) {
      SCOPED_TRACE(std::string(ac.name) + ", n " + std::to_string(n) + " p0 " + std::to_string(p0));
      const float scale = ac.scale > 0 ? ac.scale : 1.0f / std::sqrt(static_cast<float>(hd));
      const std::vector<float> sl = ac.alibi ? slopes : std::vector<float>{};
      const std::vector<float> got = replay_attention(q, K, V, n, p0, heads, kv_heads, hd, scale, ac.window, sl);
      const Reference ref = reference_attention(q.data(), K.data(), V.data(), n, p0, heads, kv_heads, hd, scale, ac.window, sl);
      const double bound = attention_bound(ref, hd, L);
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - ref.out[i]));
      ASSERT_LE(worst, bound);
    }
  }
}

TEST(CudaDecoderElement, PartialRopeChannelPairsMatchOpsRope) {
  const int hd = 16, heads = 3;
  const int64_t n = 5;
  const std::vector<int32_t> pos = {0, 1, 7, 300, -20};
  for (const RopeLayout layout : {RopeLayout::Interleaved, RopeLayout::HalfSplit}) {
    for (const int rot : {0, 2, 4, 8, 16}) {
      SCOPED_TRACE(std::string(rope_layout_name(layout)) + " rot_dim " + std::to_string(rot));
      // The pairs of i < hd/2 cover every channel of the head exactly once.
      std::vector<int> seen(hd, 0);
      for (int i = 0; i < hd / 2; ++i) {
        int a, b;
        const bool r = kvdev::rope_channel_pair(layout == RopeLayout::Interleaved, i, rot / 2, a, b);
        EXPECT_EQ(r, i < rot / 2);
        ++seen[size_t(a)];
        ++seen[size_t(b)];
      }
      for (int c = 0; c < hd; ++c) EXPECT_EQ(seen[size_t(c)], 1) << c;
      // Rotating the rotated pairs by pos·inv_freq[i] (ops::rope_table's angle and cos/sin) is
      // ops::rope's rot_dim overload: the same products, up to which of x0·c, x1·s g++ fuses into
      // an FMA in each compiled loop (≤ 1 ulp of each term: 4u·(|x0| + |x1|) ≤ 5e-7 for |x| ≤ 1);
      // a wrong pairing would be off by O(1).
      const std::vector<float> inv = rot > 0 ? rope_inv_freq<float>(10000.0f, rot, RopeScaling{}) : std::vector<float>{};
      const auto x = uniform(size_t(n * heads * hd), -1, 1, 40u + uint32_t(rot));
      std::vector<float> ref = x, got = x;
      if (rot > 0) ops::rope(ref.data(), pos.data(), n, heads, hd, rot, inv.data(), layout);
      for (int64_t t = 0; t < n; ++t)
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < hd / 2; ++i) {
            int a, b;
            if (!kvdev::rope_channel_pair(layout == RopeLayout::Interleaved, i, rot / 2, a, b)) continue;
            const float angle = kvdev::rope_angle(pos[size_t(t)], inv[size_t(i)]);
            const float c = std::cos(angle), s = std::sin(angle);
            float* v = got.data() + (t * heads + h) * hd;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
          }
      for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 5e-7) << i;
    }
  }
}

TEST(CudaDecoderElement, WeightedAddIsTheCpuMoeExpression) {
  const auto y = uniform(4096, -3, 3, 50), s = uniform(4096, -3, 3, 51), w = uniform(4096, 0, 1, 52);
  for (size_t i = 0; i < y.size(); ++i) {
    // Decoder: y[t·d + j] += moe_out[i·d + j] * w, which g++ (-march=native with FMA) compiles to
    // one fused multiply-add.
    ASSERT_EQ(bits_of(de::weighted_add(y[i], s[i], w[i])), bits_of(std::fma(s[i], w[i], y[i]))) << i;
  }
}

// ---- device tests: the ops against the CPU ------------------------------------------------------------------

TEST(CudaDecoderOps, ShapeErrorsAreThrownOnTheHost) {
  if (!cuda_compiled()) GTEST_SKIP() << "built without CUDA (the stubs throw UnsupportedError)";
  // Checked before any CUDA call, so these run without a device too.
  EXPECT_THROW(cuda::norm(NormKind::LayerNorm, nullptr, nullptr, nullptr, nullptr, -1, 8, 1e-5f), std::invalid_argument);
  EXPECT_THROW(cuda::activation(Activation::Gelu, nullptr, -1), std::invalid_argument);
  EXPECT_THROW(cuda::gated_activation(Activation::ReLU, nullptr, nullptr, -2), std::invalid_argument);
  const float f[4] = {1, 1, 1, 1};
  EXPECT_THROW(cuda::rope(nullptr, nullptr, 1, 1, 16, 18, f, RopeLayout::Interleaved), std::invalid_argument);
  EXPECT_THROW(cuda::rope(nullptr, nullptr, 1, 1, 16, 3, f, RopeLayout::Interleaved), std::invalid_argument);
  cuda::AttentionOptions opt;
  opt.window = -1;
  EXPECT_THROW(cuda::attention(nullptr, nullptr, nullptr, 1, 0, 4, 2, 8, nullptr, opt), std::invalid_argument);
  EXPECT_THROW(cuda::attention(nullptr, nullptr, nullptr, 1, 0, 4, 3, 8, nullptr, cuda::AttentionOptions{}), std::invalid_argument);
  EXPECT_THROW(cuda::gather_rows(nullptr, nullptr, -1, 4, nullptr), std::invalid_argument);
  EXPECT_THROW(cuda::scatter_add_rows(nullptr, nullptr, nullptr, nullptr, 2, -4), std::invalid_argument);
  EXPECT_THROW(cuda::fill(nullptr, -1, 0.0f), std::invalid_argument);
  // Zero-sized calls do nothing (no launch, no device needed).
  cuda::fill(nullptr, 0, 1.0f);
  cuda::norm(NormKind::RMSNorm, nullptr, nullptr, nullptr, nullptr, 0, 8, 1e-5f);
  EXPECT_TRUE(cuda::AttentionOptions{}.plain());
  opt.window = 0;
  opt.scale = 0.5f;
  EXPECT_FALSE(opt.plain());
}

TEST(CudaDecoderOps, NormMatchesCpuWithAndWithoutBias) {
  SQ_REQUIRE_CUDA();
  const float eps = 1e-5f;
  for (const int d : {1, 288, 1000, 3000}) {
    const int64_t n = 9;
    std::vector<float> x = uniform(size_t(n * d), -2.0f, 2.0f, 7u + uint32_t(d));
    for (int64_t t = 0; t < n; ++t)
      for (int j = 0; j < d; ++j) x[size_t(t * d + j)] += float(t) * 100.0f;  // rows with growing offsets
    const auto w = uniform(size_t(d), 0.5f, 1.5f, 8), b = uniform(size_t(d), -0.5f, 0.5f, 9);
    const DeviceArray<float> dw(w), db(b);
    for (const NormKind kind : {NormKind::RMSNorm, NormKind::LayerNorm}) {
      for (const bool bias : {true, false}) {
        if (kind == NormKind::RMSNorm && !bias) continue;
        SCOPED_TRACE(std::string(norm_kind_name(kind)) + (bias ? " bias" : " no bias") + " d " + std::to_string(d));
        const float* hb = bias ? b.data() : nullptr;
        std::vector<float> replay(x.size()), ref(x.size());
        for (int64_t t = 0; t < n; ++t) replay_norm_row(kind, x.data() + t * d, w.data(), hb, replay.data() + t * d, d, eps);
        ops::norm(kind, x.data(), w.data(), hb, ref.data(), n, d, eps);
        DeviceArray<float> dx(x), dy(x.size());
        cuda::norm(kind, dx.data(), dw.data(), bias ? db.data() : nullptr, dy.data(), n, d, eps);
        const auto got = dy.to_host();
        // The kernel is the host replay (same per-thread steps, same reduction tree, IEEE
        // operations only): equal bits. Against the CPU: LayerNorm bit-identical (see
        // CudaDecoderElement.NormElementsWithKernelReductionsMatchOps), RMSNorm within (d + 16)·u.
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_TRUE(same_float(got[i], replay[i])) << i;
          if (kind == NormKind::LayerNorm) {
            ASSERT_TRUE(same_float(got[i], ref[i])) << i;
          } else {
            ASSERT_NEAR(got[i], ref[i], (d + 16) * kU * std::fabs(ref[i]) + 1e-30) << i;
          }
        }
        cuda::norm(kind, dx.data(), dw.data(), bias ? db.data() : nullptr, dx.data(), n, d, eps);  // in place
        EXPECT_EQ(dx.to_host(), got);
      }
    }
    // rms_norm is norm(RMSNorm).
    DeviceArray<float> dx(x), d1(x.size()), d2(x.size());
    cuda::rms_norm(dx.data(), dw.data(), d1.data(), n, d, eps);
    cuda::norm(NormKind::RMSNorm, dx.data(), dw.data(), db.data(), d2.data(), n, d, eps);  // b ignored
    EXPECT_EQ(d1.to_host(), d2.to_host());
  }
}

TEST(CudaDecoderOps, ActivationsMatchCpu) {
  SQ_REQUIRE_CUDA();
  const std::vector<float> x = activation_inputs();
  const int64_t count = static_cast<int64_t>(x.size());
  const auto u = uniform(x.size(), -3.0f, 3.0f, 79);
  const DeviceArray<float> du(u);
  for (const Activation a : kActivations) {
    SCOPED_TRACE(act_name(a));
    for (const bool gated : {false, true}) {
      std::vector<float> ref = x;
      DeviceArray<float> dx(x);
      if (gated) {
        ops::gated_activation(a, ref.data(), u.data(), count);
        cuda::gated_activation(a, dx.data(), du.data(), count);
      } else {
        ops::activation(a, ref.data(), count);
        cuda::activation(a, dx.data(), count);
      }
      const auto got = dx.to_host();
      for (size_t i = 0; i < got.size(); ++i) {
        if (a != Activation::Gelu) {
          // SiLU, GeluTanh, ReLU: the same operations (fast_exp polynomial, IEEE division) on both
          // sides: equal bits.
          ASSERT_TRUE(same_float(got[i], ref[i])) << (gated ? "gated " : "") << "x = " << x[i];
          continue;
        }
        // Gelu: erff (≤ 2 ulp) vs glibc erf (≤ 1 ulp) of the same argument: ≤ 3·2^−24 apart
        // (|erf| ≤ 1), one more rounding of 1 + erf (2^−24·2), times 0.5·|x| (·|u| when gated),
        // plus 2 roundings of the result.
        if (std::isnan(ref[i]) || std::isinf(ref[i])) {
          ASSERT_TRUE(same_float(got[i], ref[i])) << x[i];
          continue;
        }
        const double scale = 0.5 * std::fabs(double(x[i])) * (gated ? std::fabs(double(u[i])) : 1.0);
        ASSERT_NEAR(got[i], ref[i], scale * 5.0 * kU + 4.0 * kU * std::fabs(ref[i]) + 1e-37) << (gated ? "gated " : "") << "x = " << x[i];
      }
    }
  }
  // swiglu is gated_activation(SiLU): bit-identical to ops::swiglu.
  std::vector<float> ref = x;
  ops::swiglu(ref.data(), u.data(), count);
  DeviceArray<float> dx(x);
  cuda::swiglu(dx.data(), du.data(), count);
  const auto got = dx.to_host();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(same_float(got[i], ref[i])) << x[i];
}

TEST(CudaDecoderOps, PartialRopeMatchesCpuRotDimOverload) {
  SQ_REQUIRE_CUDA();
  const int64_t n = 20;
  const int heads = 3, hd = 64;
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[size_t(t)] = int32_t(t * 97 % 600) - 50;
  const DeviceArray<int32_t> dp(pos);
  for (const RopeLayout layout : {RopeLayout::Interleaved, RopeLayout::HalfSplit}) {
    for (const int rot : {hd / 2, 16, hd, 2}) {
      SCOPED_TRACE(std::string(rope_layout_name(layout)) + " rot_dim " + std::to_string(rot));
      const std::vector<float> inv = rope_inv_freq<float>(10000.0f, rot, RopeScaling{});
      const auto x = uniform(size_t(n * heads * hd), -1, 1, 3);
      std::vector<float> ref = x;
      ops::rope(ref.data(), pos.data(), n, heads, hd, rot, inv.data(), layout);
      DeviceArray<float> dx(x);
      cuda::rope(dx.data(), dp.data(), n, heads, hd, rot, inv.data(), layout);
      const auto got = dx.to_host();
      // Rotated channels: the same FP32 angles, cosf/sinf ≤ 2 ulp vs glibc's ≤ 1: ≤ 6e-7 for
      // |x| ≤ 1 (CudaOps.RopeMatchesCpuBothLayouts…); 2e-6 leaves room for range reduction.
      // Channels past rot_dim are untouched: equal bits.
      for (int64_t r = 0; r < n * heads; ++r)
        for (int c = 0; c < hd; ++c) {
          const size_t i = size_t(r * hd + c);
          if (c >= rot) ASSERT_EQ(bits_of(got[i]), bits_of(x[i])) << i;
          else ASSERT_NEAR(got[i], ref[i], 2e-6) << i;
        }
      if (rot == hd) {  // the full overload is rot_dim = head_dim
        DeviceArray<float> dy(x);
        cuda::rope(dy.data(), dp.data(), n, heads, hd, inv.data(), layout);
        EXPECT_EQ(dy.to_host(), got);
      }
    }
  }
  // rot_dim = 0 leaves x as is.
  const auto x = uniform(size_t(n * heads * hd), -1, 1, 4);
  DeviceArray<float> dx(x);
  cuda::rope(dx.data(), dp.data(), n, heads, hd, 0, nullptr, RopeLayout::HalfSplit);
  EXPECT_EQ(dx.to_host(), x);
}

TEST(CudaDecoderOps, AttentionOptionsMatchDoublePrecisionReference) {
  SQ_REQUIRE_CUDA();
  const int heads = 8, kv_heads = 2, hd = 32;
  const std::vector<float> slopes = alibi_slopes(heads);
  const DeviceArray<float> dslopes(slopes);
  for (auto [n, p0] : {std::pair<int64_t, int64_t>{70, 40}, {1, 109}, {5, 0}}) {
    const int64_t L = p0 + n;
    const auto q = uniform(size_t(n * heads * hd), -1, 1, 12), K = uniform(size_t(L * kv_heads * hd), -1, 1, 13),
               V = uniform(size_t(L * kv_heads * hd), -1, 1, 14);
    const DeviceArray<float> dq(q), dK(K), dV(V);
    DeviceArray<float> plain(q.size());
    cuda::attention(dq.data(), dK.data(), dV.data(), n, p0, heads, kv_heads, hd, plain.data());
    const std::vector<float> plain_host = plain.to_host();
    for (const AttentionCase& ac : kAttentionCases) {
      SCOPED_TRACE(std::string(ac.name) + ", n " + std::to_string(n) + " p0 " + std::to_string(p0));
      cuda::AttentionOptions opt;
      opt.scale = ac.scale;
      opt.window = ac.window;
      opt.alibi_slopes = ac.alibi ? dslopes.data() : nullptr;
      DeviceArray<float> dout(q.size());
      cuda::attention(dq.data(), dK.data(), dV.data(), n, p0, heads, kv_heads, hd, dout.data(), opt);
      const auto got = dout.to_host();
      const float scale = ac.scale > 0 ? ac.scale : 1.0f / std::sqrt(static_cast<float>(hd));
      const std::vector<float> sl = ac.alibi ? slopes : std::vector<float>{};
      const Reference ref = reference_attention(q.data(), K.data(), V.data(), n, p0, heads, kv_heads, hd, scale, ac.window, sl);
      const double bound = attention_bound(ref, hd, L);
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - ref.out[i]));
      ASSERT_LE(worst, bound);
      // The kernel is the host replay but for expf (device, ≤ 2 ulp) vs std::exp (host, ≤ 1 ulp):
      // each weight ≤ 3u apart, so outputs ≤ vmax·(L + 8)·3u apart (a much tighter check of the
      // order of operations than the reference bound).
      const std::vector<float> replay = replay_attention(q, K, V, n, p0, heads, kv_heads, hd, scale, ac.window, sl);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], replay[i], ref.vmax * (L + 8) * 3 * kU) << i;
      // Default options (and a window covering the whole context) are the plain kernel, bit for bit.
      if (std::string(ac.name) == "plain" || std::string(ac.name) == "window past the context") {
        EXPECT_EQ(got, plain_host);
      }
    }
  }
}

TEST(CudaDecoderOps, GatherScatterFillAreExact) {
  SQ_REQUIRE_CUDA();
  const int d = 37;
  const int64_t rows_x = 10;
  const auto x = uniform(size_t(rows_x * d), -5, 5, 60);
  const std::vector<int32_t> rows = {3, 7, 0, 9};
  const int64_t m = static_cast<int64_t>(rows.size());
  const DeviceArray<float> dx(x);
  const DeviceArray<int32_t> dr(rows);
  DeviceArray<float> dg(size_t(m * d));
  cuda::gather_rows(dx.data(), dr.data(), m, d, dg.data());
  const auto g = dg.to_host();
  for (int64_t i = 0; i < m; ++i)
    for (int j = 0; j < d; ++j) ASSERT_EQ(bits_of(g[size_t(i * d + j)]), bits_of(x[size_t(rows[size_t(i)] * d + j)])) << i << "," << j;
  // scatter_add_rows: y[rows[i], j] += src[i, j]·w[i], the CPU MoE expression; two experts in turn.
  auto y = uniform(size_t(rows_x * d), -1, 1, 61);
  DeviceArray<float> dy(y);
  for (int e = 0; e < 2; ++e) {
    const auto src = uniform(size_t(m * d), -2, 2, 62u + uint32_t(e)), w = uniform(size_t(m), 0, 1, 64u + uint32_t(e));
    const DeviceArray<float> ds(src), dw(w);
    cuda::scatter_add_rows(dy.data(), ds.data(), dr.data(), dw.data(), m, d);
    for (int64_t i = 0; i < m; ++i)
      for (int j = 0; j < d; ++j) y[size_t(rows[size_t(i)] * d + j)] += src[size_t(i * d + j)] * w[size_t(i)];
  }
  EXPECT_EQ(dy.to_host(), y);
  cuda::fill(dy.data(), rows_x * d, -0.25f);
  EXPECT_EQ(dy.to_host(), std::vector<float>(size_t(rows_x * d), -0.25f));
}

// ---- device tests: CudaKVCache with per-layer RoPE and attention options -----------------------------------

/// Random nuq parameters: sorted codebooks in [−1, 1]; per-channel key scaling with scale ∈ [6, 10]
/// around offsets N(0, 0.3), so rows of N(0, 2) values have few per-channel outliers (well under the
/// device's per-row capacity).
std::vector<NuqLayerParams> random_nuq_params(const ModelConfig& c, int bits, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), sc(6.0f, 10.0f);
  std::normal_distribution<float> off(0.0f, 0.3f);
  std::vector<NuqLayerParams> p(static_cast<size_t>(c.n_layers));
  const size_t width = static_cast<size_t>(c.n_kv_heads * c.head_dim);
  for (NuqLayerParams& l : p) {
    for (auto* cb : {&l.key_codebook, &l.value_codebook}) {
      cb->resize(size_t(1) << bits);
      for (float& e : *cb) e = u(rng);
      std::sort(cb->begin(), cb->end());
    }
    l.key_offset.resize(width);
    l.key_scale.resize(width);
    for (size_t i = 0; i < width; ++i) {
      l.key_offset[i] = off(rng);
      l.key_scale[i] = sc(rng);
    }
  }
  return p;
}

std::vector<KVSpec> kv_specs() {
  std::vector<KVSpec> specs;
  auto add = [&](const std::string& text, double outliers, int sinks, const std::string& keys) {
    KVSpec s = parse_kv_spec(text);
    apply_kv_options(s, -1, outliers, false, sinks, keys, "");
    specs.push_back(s);
  };
  add("fp32", -1, -1, "");           // post-RoPE, read in place
  add("fp32", -1, -1, "pre-rope");   // rotated when dequantized / in the decode kernel
  add("int4", -1, 2, "");
  add("int8", -1, -1, "pre-rope");
  add("nuq4", 0.01, -1, "");         // pre-RoPE per-channel keys, 1% outliers, 1 sink
  add("nuq3", 0.0, 0, "");
  return specs;
}

/// Appends random K/V rows to a CPU KVCache and a CudaKVCache (a prefill of `prefill` rows, then
/// single rows) and compares, at every step and layer, CudaKVCache::attend with the layer's options
/// against a double-precision attention over the CPU cache's decoded rows (KVCache::read: its
/// partial rotation at the layer's frequencies). `scale` / `slopes` as AttentionOptions (host slopes).
void check_kv_attention(const ModelConfig& c, const KVSpec& spec, int64_t rows, int64_t prefill, float scale,
                        const std::vector<float>& slopes) {
  const std::vector<NuqLayerParams> params = random_nuq_params(c, spec.kind == KVKind::Nuq ? spec.bits : 2, 31);
  const std::vector<NuqLayerParams>* pp = spec.kind == KVKind::Nuq ? &params : nullptr;
  const int64_t W = int64_t(c.n_kv_heads) * c.head_dim, qw = int64_t(c.n_heads) * c.head_dim;
  KVCache cpu(c, rows, spec, pp);
  CudaKVCache gpu(c, rows, spec, pp);
  EXPECT_EQ(gpu.rope_dim(), c.spec.position == PositionKind::Rope ? c.rope_dim() : 0);
  const DeviceArray<float> dslopes(slopes.empty() ? std::vector<float>(1) : slopes);
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> kbuf, vbuf;
  int64_t p0 = 0;
  while (p0 < rows) {
    const int64_t n = p0 == 0 ? prefill : 1;
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(p0 + i);
    const DeviceArray<int32_t> dpos(pos);
    for (int l = 0; l < c.n_layers; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l) + ", rows " + std::to_string(p0) + " + " + std::to_string(n));
      std::vector<float> kk(static_cast<size_t>(n * W)), vv(static_cast<size_t>(n * W));
      for (auto& e : kk) e = nd(rng);
      for (auto& e : vv) e = nd(rng);
      DeviceArray<float> dk(kk);
      const DeviceArray<float> dv(vv);
      gpu.append(l, dk.data(), dv.data(), n, dpos.data());
      // Post-RoPE formats: the device rotated dk in place (cuda::rope over rope_dim, the layer's
      // frequencies); the CPU cache stores those keys, as Decoder stores the keys it rotated.
      if (!cpu.keys_pre_rope()) kk = dk.to_host();
      cpu.write(l, kk.data(), vv.data(), n);
      std::vector<float> q(static_cast<size_t>(n * qw));
      for (auto& e : q) e = nd(rng) * 0.5f;
      const DeviceArray<float> dq(q);
      DeviceArray<float> dout(q.size());
      cuda::AttentionOptions opt;
      opt.scale = scale;
      opt.window = c.window(l);
      opt.alibi_slopes = slopes.empty() ? nullptr : dslopes.data();
      gpu.attend(l, dq.data(), n, dout.data(), opt);
      const std::vector<float> got = dout.to_host();
      const KVCache::View view = cpu.read(l, p0 + n, kbuf, vbuf);
      const float s = scale > 0 ? scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
      const Reference ref = reference_attention(q.data(), view.keys, view.values, n, p0, c.n_heads, c.n_kv_heads, c.head_dim, s,
                                                opt.window, slopes);
      // Keys: the device decodes the CPU codec's bytes (fused multiply-adds, ≤ 2u relative per
      // element) and rotates pre-RoPE keys with sincosf (≤ 2 ulp) where the CPU uses cos/sin:
      // ≤ 6u relative per key element, on top of attention_bound's FP32 attention error.
      const double bound = attention_bound(ref, c.head_dim, p0 + n, 6 * kU);
      double worst = 0;
      for (size_t e = 0; e < got.size(); ++e) worst = std::max(worst, std::fabs(double(got[e]) - ref.out[e]));
      ASSERT_LE(worst, bound) << "n = " << n << (opt.plain() && n == 1 ? " (split-K decode kernel)" : "");
    }
    cpu.advance(n);
    gpu.advance(n);
    p0 += n;
  }
  EXPECT_EQ(gpu.clamped_outliers(), 0);
}

ModelConfig small_config(RopeLayout layout) {
  ModelConfig c;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 32;
  c.dim = c.n_heads * c.head_dim;
  c.hidden_dim = 2 * c.dim;
  c.n_layers = 2;
  c.vocab_size = 16;
  c.max_seq_len = 1024;
  c.rope_layout = layout;
  return c;
}

TEST(CudaDecoderKV, PartialRotaryLocalThetaSlidingWindowMatchesCpuCache) {
  SQ_REQUIRE_CUDA();
  // Gemma-3-like: layer 0 a sliding-window layer (window 8, local θ 10^4), layer 1 global (θ 10^6);
  // half the head rotated (Phi / GPT-NeoX partial rotary). Decode steps on layer 1 (plain options)
  // run the split-K kernel over the packed rows with partial rotation; layer 0 the
  // dequantize + windowed attention path.
  for (const RopeLayout layout : {RopeLayout::HalfSplit, RopeLayout::Interleaved}) {
    ModelConfig c = small_config(layout);
    c.rope_theta = 1e6f;
    c.spec.rope_dim = c.head_dim / 2;
    c.spec.layer_window = {8, 0};
    c.spec.rope_local_theta = 1e4f;
    ASSERT_NE(rope_inv_freq(c, 0), rope_inv_freq(c, 1));
    for (const KVSpec& spec : kv_specs()) {
      SCOPED_TRACE(kv_spec_name(spec) + (layout == RopeLayout::HalfSplit ? " half-split" : " interleaved"));
      check_kv_attention(c, spec, 48, 40, 0.0f, {});
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CudaDecoderKV, AlibiWithScaleAndNoRopeMatchesCpuCache) {
  SQ_REQUIRE_CUDA();
  // BLOOM / MPT-like: no rotary embedding (keys never rotated, pre-RoPE or not), ALiBi slopes and
  // an explicit softmax scale, so every attend takes the dequantize + cuda::attention path.
  ModelConfig c = small_config(RopeLayout::HalfSplit);
  c.spec.position = PositionKind::Alibi;
  c.spec.attn_scale = 0.2f;
  const std::vector<float> slopes = alibi_slopes(c.n_heads);
  for (const KVSpec& spec : kv_specs()) {
    SCOPED_TRACE(kv_spec_name(spec));
    check_kv_attention(c, spec, 40, 30, c.spec.attn_scale, slopes);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace sq
