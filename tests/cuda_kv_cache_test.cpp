// The CUDA KV cache (lib/cuda/cuda_kv_cache.h).
//
// CudaKVMath.* run everywhere: the host/device element math of cuda/kv_device_math.h (the exact
// arithmetic of the device encoder and decoder) against the CPU codecs, packing and codebook code,
// and "mirror" encoders that combine those functions in the device kernel's order, on real
// stories260K K/V rows and on heavy-tailed random rows with non-finite values.
//
// CudaKVCache.* need a device (skipped otherwise): for every format, rows appended on the device
// must have the CPU codec's bytes (dense rows, sparse outliers, FP16 sinks), attention over them
// must match a double-precision attention over KVCache::read's rows, and bytes() must equal
// KVCache::bytes().
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "calib/fisher.h"
#include "calib/kv_calibration.h"
#include "calib/window_sampler.h"
#include "cuda/cuda_kv_cache.h"
#include "cuda/cuda_runtime.h"
#include "cuda/kv_device_math.h"
#include "formats/llama2c_checkpoint.h"
#include "formats/safetensors.h"
#include "formats/tokenizer.h"
#include "model/decoder.h"
#include "ops/ops.h"
#include "quant/codebook_quantize.h"
#include "quant/kv_codec.h"
#include "quant/packed_bits.h"
#include "runtime/kv_cache.h"
#include "support/test_data.h"

namespace sq {
namespace {

namespace kd = kvdev;

constexpr double kU = 5.96e-8;  // FP32 unit roundoff 2^-24

// ---- shared data ---------------------------------------------------------------------------------

struct RealKV {
  ModelConfig config;
  int64_t rows = 0, width = 0;
  std::vector<std::vector<float>> k, v;  ///< [layer][rows, width], keys before RoPE
};

/// K (before RoPE) and V rows of every layer of stories260K over the first `rows` tokens of the
/// TinyStories validation text: an FP32 pre-RoPE KVCache stores the rows verbatim.
const RealKV& real_kv() {
  static const RealKV kv = [] {
    RealKV r;
    const Checkpoint ck = load_llama2c_checkpoint(test::stories_model());
    const Decoder model = Decoder::from_checkpoint(ck);
    auto tok = load_tokenizer(test::stories_tokenizer());
    const std::vector<int> ids =
        tok->encode("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. "
                    "One day, she saw a big red ball under a tree and ran to get it, but a small dog took it first.",
                    true, false);
    r.config = ck.config;
    r.rows = std::min<int64_t>(64, static_cast<int64_t>(ids.size()));
    r.width = int64_t(ck.config.n_kv_heads) * ck.config.head_dim;
    KVSpec pre;
    pre.keys = KVKeyRope::PreRope;
    KVCache cache(ck.config, r.rows, pre);
    Workspace ws;
    const std::vector<int32_t> t(ids.begin(), ids.begin() + r.rows);
    model.forward(t.data(), r.rows, cache, ws, nullptr, LogitsFor::None);
    for (int l = 0; l < ck.config.n_layers; ++l) {
      const KVCache::LayerStorage st = cache.layer_storage(l);
      const float* kk = reinterpret_cast<const float*>(st.keys);
      const float* vv = reinterpret_cast<const float*>(st.values);
      r.k.emplace_back(kk, kk + r.rows * r.width);
      r.v.emplace_back(vv, vv + r.rows * r.width);
    }
    return r;
  }();
  return kv;
}

/// Heavy-tailed rows (Student t, 3 degrees of freedom, ×2) with a few ±inf / NaN / ±0 mixed in.
std::vector<float> random_rows(int64_t rows, int64_t width, uint32_t seed, bool non_finite) {
  std::mt19937 rng(seed);
  std::student_t_distribution<float> t3(3.0f);
  std::vector<float> x(static_cast<size_t>(rows * width));
  for (float& e : x) e = 2.0f * t3(rng);
  if (non_finite)
    for (int64_t r = 0; r < rows; ++r) {
      float* row = x.data() + r * width;
      row[(r * 7) % width] = INFINITY;
      row[(r * 11 + 3) % width] = -INFINITY;
      row[(r * 13 + 5) % width] = NAN;
      row[(r * 17 + 1) % width] = -0.0f;
      row[(r * 19 + 2) % width] = 0.0f;
    }
  return x;
}

/// Per-channel nuq key scaling from data (thresholds = per-channel min/max over the rows, as
/// fit_nuq_layer does without outliers), so that real rows are in range.
void channel_scaling(const std::vector<float>& x, int64_t rows, int64_t width, std::vector<float>& offset, std::vector<float>& scale) {
  offset.assign(static_cast<size_t>(width), 0.0f);
  scale.assign(static_cast<size_t>(width), 1.0f);
  for (int64_t c = 0; c < width; ++c) {
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t r = 0; r < rows; ++r) {
      const float e = x[size_t(r * width + c)];
      if (!std::isfinite(e)) continue;
      lo = std::min(lo, e);
      hi = std::max(hi, e);
    }
    offset[size_t(c)] = 0.5f * (hi + lo);
    scale[size_t(c)] = 0.45f * (hi - lo);  // < half range: the extreme values fall outside [−1, 1]
  }
}

std::vector<float> sorted_codebook(int bits, uint32_t seed, bool duplicate) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> cb(size_t(1) << bits);
  for (float& e : cb) e = u(rng);
  std::sort(cb.begin(), cb.end());
  if (duplicate && cb.size() >= 4) cb[2] = cb[1];  // a repeated signpost: never emitted
  return cb;
}

// ---- mirror encoders: the device kernel's steps, run serially on the host ---------------------------

std::vector<uint8_t> mirror_uniform(const float* x, int64_t W, int64_t group, int bits) {
  const int64_t code_bytes = (W * bits + 7) / 8;
  std::vector<uint8_t> out(static_cast<size_t>(code_bytes + 4 * (W / group)), 0), codes(static_cast<size_t>(W));
  const float qmax = float((1 << bits) - 1);
  for (int64_t g = 0; g < W / group; ++g) {
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t c = g * group; c < (g + 1) * group; ++c) {
      if (!kd::is_finite(x[c])) continue;
      lo = x[c] < lo ? x[c] : lo;
      hi = hi < x[c] ? x[c] : hi;
    }
    const kd::UniformGroup p = kd::uniform_group(lo, hi, qmax);
    kd::store_u16(out.data() + code_bytes + 4 * g, p.d16);
    kd::store_u16(out.data() + code_bytes + 4 * g + 2, p.z16);
    for (int64_t c = g * group; c < (g + 1) * group; ++c) codes[size_t(c)] = uint8_t(kd::uniform_code(x[c], p, qmax));
  }
  for (int64_t b = 0; b < code_bytes; ++b) out[size_t(b)] = kd::pack_byte(codes.data(), W, bits, b);
  return out;
}

std::vector<uint8_t> mirror_nuq(const float* x, int64_t W, int bits, bool per_channel, double p, const std::vector<float>& cb,
                                const std::vector<float>& offset, const std::vector<float>& scale, int64_t cap,
                                std::vector<KVOutlier>& sparse, int64_t& clamped) {
  const int64_t code_bytes = (W * bits + 7) / 8;
  std::vector<uint8_t> out(static_cast<size_t>(code_bytes + (per_channel ? 0 : 4)), 0), codes(static_cast<size_t>(W));
  std::vector<double> mids;
  std::vector<uint8_t> first;
  nuq_signpost_tables(cb, mids, first);
  float o = 0.0f, s = 1.0f;
  if (!per_channel) {
    float lo = 0.0f, hi = 0.0f;
    if (p > 0) {
      int64_t N = 1;
      while (N < W) N <<= 1;
      std::vector<float> buf(static_cast<size_t>(N), INFINITY);
      int64_t finite = 0;
      for (int64_t c = 0; c < W; ++c)
        if (kd::is_finite(x[c])) {
          buf[size_t(c)] = x[c];
          ++finite;
        }
      for (int64_t k = 2; k <= N; k <<= 1)
        for (int64_t j = k >> 1; j > 0; j >>= 1)
          for (int64_t e = 0; e < N; ++e) kd::bitonic_step(buf.data(), e, k, j);
      if (finite > 0) {
        lo = kd::sorted_percentile(buf.data(), finite, p / 2);
        hi = kd::sorted_percentile(buf.data(), finite, 1.0 - p / 2);
      }
    } else {
      float mn = INFINITY, mx = -INFINITY;
      int64_t imx = -1;
      for (int64_t c = 0; c < W; ++c) {
        if (!kd::is_finite(x[c])) continue;
        if (x[c] < mn) mn = x[c];
        if (!(x[c] < mx)) {
          mx = x[c];
          imx = c;
        }
      }
      if (imx >= 0) {
        lo = mn;
        hi = mx;
      }
    }
    kd::token_scaling(lo, hi, o, s);
    kd::store_u16(out.data() + code_bytes, kd::float_to_half(s));
    kd::store_u16(out.data() + code_bytes + 2, kd::float_to_half(o));
  }
  const int K = 1 << bits;
  for (int64_t c = 0; c < W; ++c) {
    const float oc = per_channel ? offset[size_t(c)] : o, sc = per_channel ? scale[size_t(c)] : s;
    const float v = kd::nuq_input(x[c]);
    const float a = kd::nuq_normalize(v, oc, sc);
    if (p > 0 && std::fabs(a) > 1.0f) {
      if (static_cast<int64_t>(sparse.size()) < cap) {
        sparse.push_back({uint16_t(c), kd::float_to_half(v)});
        codes[size_t(c)] = 0;
      } else {
        codes[size_t(c)] = uint8_t(kd::nearest_signpost(kd::clamp_unit(a), mids.data(), first.data(), K));
        ++clamped;
      }
      continue;
    }
    codes[size_t(c)] = uint8_t(kd::nearest_signpost(kd::clamp_unit(a), mids.data(), first.data(), K));
  }
  for (int64_t b = 0; b < code_bytes; ++b) out[size_t(b)] = kd::pack_byte(codes.data(), W, bits, b);
  return out;
}

bool same_outliers(const std::vector<KVOutlier>& a, const std::vector<KVOutlier>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].channel != b[i].channel || a[i].value_f16 != b[i].value_f16) return false;
  return true;
}

// ---- CPU tests of the shared element math ------------------------------------------------------------

TEST(CudaKVMath, HalfConversionsAreBitIdenticalToCpu) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = kd::half_to_float(uint16_t(h)), b = half_to_float(uint16_t(h));
    ASSERT_EQ(kd::float_bits(a), kd::float_bits(b)) << "half bits " << h;
  }
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, 1e-8f, -3e-5f, 6.1035156e-05f, INFINITY, -INFINITY, NAN};
  for (const auto& l : real_kv().k) xs.insert(xs.end(), l.begin(), l.end());
  for (const auto& l : real_kv().v) xs.insert(xs.end(), l.begin(), l.end());
  std::mt19937 rng(1);
  for (int i = 0; i < 1 << 20; ++i) xs.push_back(kd::bits_float(rng()));  // every exponent, subnormals, NaN payloads
  for (size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(kd::float_to_half(xs[i]), float_to_half(xs[i])) << "value " << xs[i] << " index " << i;
}

TEST(CudaKVMath, PackedBytesAndCodesMatchPackedBits) {
  std::mt19937 rng(2);
  for (int bits = 1; bits <= 8; ++bits)
    for (int64_t n : {1, 7, 32, 37, 129}) {
      std::vector<uint8_t> codes(static_cast<size_t>(n));
      for (auto& c : codes) c = uint8_t(rng() & ((1u << bits) - 1u));
      std::vector<uint8_t> ref(static_cast<size_t>(packed_bytes_for(n, bits)), 0);
      pack_bits(codes.data(), n, bits, ref.data());
      for (int64_t b = 0; b < int64_t(ref.size()); ++b)
        ASSERT_EQ(kd::pack_byte(codes.data(), n, bits, b), ref[size_t(b)]) << "bits " << bits << " n " << n << " byte " << b;
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(kd::packed_code(ref.data(), i, bits), packed_get(ref.data(), i, bits));
    }
}

TEST(CudaKVMath, NearestSignpostMatchesCodebookQuantizer) {
  for (int bits : {2, 3, 4}) {
    for (bool dup : {false, true}) {
      const std::vector<float> cb = sorted_codebook(bits, 10u + uint32_t(bits), dup);
      const CodebookQuantizer cq(cb, bits);
      std::vector<double> mids;
      std::vector<uint8_t> first;
      nuq_signpost_tables(cb, mids, first);
      std::vector<float> xs;
      for (size_t j = 0; j < cb.size(); ++j) {
        xs.push_back(cb[j]);
        if (j + 1 < cb.size()) {  // exact midpoints (ties) and their neighbours
          const float m = static_cast<float>(0.5 * (double(cb[j]) + double(cb[j + 1])));
          xs.insert(xs.end(), {m, std::nextafter(m, -2.0f), std::nextafter(m, 2.0f)});
        }
      }
      std::mt19937 rng(3);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (int i = 0; i < 20000; ++i) xs.push_back(u(rng));
      xs.insert(xs.end(), {-1.0f, 1.0f});
      for (const float x : xs)
        ASSERT_EQ(kd::nearest_signpost(x, mids.data(), first.data(), 1 << bits), cq.encode(x)) << "bits " << bits << " x " << x;
    }
  }
}

TEST(CudaKVMath, BitonicSortAndPercentilesMatchKvPercentile) {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int64_t n : {1, 2, 5, 32, 100, 4096}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& e : x) e = std::round(nd(rng) * 8.0f) / 8.0f;  // many ties
    int64_t N = 1;
    while (N < n) N <<= 1;
    std::vector<float> buf(static_cast<size_t>(N), INFINITY);
    std::copy(x.begin(), x.end(), buf.begin());
    for (int64_t k = 2; k <= N; k <<= 1)
      for (int64_t j = k >> 1; j > 0; j >>= 1)
        for (int64_t e = 0; e < N; ++e) kd::bitonic_step(buf.data(), e, k, j);
    std::vector<float> ref = x;
    std::sort(ref.begin(), ref.end());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(buf[size_t(i)], ref[size_t(i)]) << "n " << n << " i " << i;
    for (double q : {0.0, 0.005, 0.01 / 2, 0.05, 0.5, 0.95, 0.995, 1.0 - 0.01 / 2, 1.0}) {
      std::vector<float> tmp = x;
      EXPECT_EQ(kd::sorted_percentile(buf.data(), n, q), kv_percentile(tmp.data(), n, q)) << "n " << n << " q " << q;
    }
  }
}

TEST(CudaKVMath, FindOutlierIsABinarySearch) {
  std::vector<uint32_t> e;
  for (unsigned c : {0u, 3u, 4u, 17u, 900u, 4095u}) e.push_back(kd::outlier_entry(c, uint16_t(c * 3)));
  for (unsigned c = 0; c < 4100; ++c) {
    const auto it = std::find_if(e.begin(), e.end(), [&](uint32_t x) { return kd::outlier_channel(x) == c; });
    const int want = it == e.end() ? -1 : int(it - e.begin());
    ASSERT_EQ(kd::find_outlier(e.data(), int(e.size()), c), want) << c;
  }
  EXPECT_EQ(kd::find_outlier(e.data(), 0, 0), -1);
  KVOutlier o{17, 0x3c00};
  uint32_t img;
  std::memcpy(&img, &o, 4);  // the device entry is the memory image of KVOutlier
  EXPECT_EQ(img, kd::outlier_entry(17, 0x3c00));
}

TEST(CudaKVMath, UniformMirrorEncoderMatchesCpuCodecOnRealAndRandomRows) {
  const RealKV& kv = real_kv();
  const std::vector<float> rnd = random_rows(16, 4096, 5, true);
  for (int bits : {8, 4, 3, 2}) {
    for (int64_t group : {kv.config.head_dim, 4}) {
      const auto codec = make_kv_uniform_codec(kv.width, group, bits);
      std::vector<uint8_t> ref(static_cast<size_t>(codec->row_bytes()));
      std::vector<KVOutlier> none;
      for (size_t l = 0; l < kv.k.size(); ++l)
        for (const auto* rows : {&kv.k[l], &kv.v[l]})
          for (int64_t r = 0; r < kv.rows; ++r) {
            const float* x = rows->data() + r * kv.width;
            codec->encode(x, ref.data(), none);
            ASSERT_EQ(mirror_uniform(x, kv.width, group, bits), ref) << "int" << bits << " g" << group << " layer " << l << " row " << r;
          }
    }
    for (int64_t group : {128, 32}) {
      const auto codec = make_kv_uniform_codec(4096, group, bits);
      std::vector<uint8_t> ref(static_cast<size_t>(codec->row_bytes()));
      std::vector<KVOutlier> none;
      for (int64_t r = 0; r < 16; ++r) {
        codec->encode(rnd.data() + r * 4096, ref.data(), none);
        ASSERT_EQ(mirror_uniform(rnd.data() + r * 4096, 4096, group, bits), ref) << "int" << bits << " g" << group << " random row " << r;
      }
    }
  }
}

TEST(CudaKVMath, NuqMirrorEncoderMatchesCpuCodecOnRealAndRandomRows) {
  const RealKV& kv = real_kv();
  const int64_t RW = 4096, RR = 12;
  const std::vector<float> rnd = random_rows(RR, RW, 6, true), scaling_rows = random_rows(400, RW, 7, false);
  int64_t outliers_seen = 0;
  for (int bits : {4, 3, 2}) {
    const std::vector<float> cb = sorted_codebook(bits, 20u + uint32_t(bits), bits == 4);
    for (double p : {0.0, 0.01, 0.1}) {
      for (bool per_channel : {true, false}) {
        for (size_t l = 0; l < kv.k.size(); ++l) {
          std::vector<float> off, sc;
          channel_scaling(kv.k[l], kv.rows, kv.width, off, sc);
          const auto codec = make_kv_nuq_codec(kv.width, bits, per_channel, p, cb, per_channel ? off : std::vector<float>{},
                                               per_channel ? sc : std::vector<float>{});
          std::vector<uint8_t> ref(static_cast<size_t>(codec->row_bytes()));
          for (const auto* rows : {&kv.k[l], &kv.v[l]})
            for (int64_t r = 0; r < kv.rows; ++r) {
              const float* x = rows->data() + r * kv.width;
              std::vector<KVOutlier> want, got;
              int64_t clamped = 0;
              codec->encode(x, ref.data(), want);
              const auto bytes = mirror_nuq(x, kv.width, bits, per_channel, p, cb, off, sc, cuda_kv_outlier_capacity(p, kv.width), got, clamped);
              ASSERT_EQ(bytes, ref) << "nuq" << bits << " p " << p << (per_channel ? " per-channel" : " per-token") << " layer " << l << " row " << r;
              ASSERT_TRUE(same_outliers(got, want)) << "outliers differ: nuq" << bits << " p " << p << " layer " << l << " row " << r;
              ASSERT_EQ(clamped, 0);
              outliers_seen += int64_t(want.size());
            }
        }
        // Random wide rows with ±inf / NaN / ±0; per-channel scaling from 400 rows of the same
        // distribution, so a row has a few (≈ 0.5%) per-channel outliers, within the capacity.
        std::vector<float> off, sc;
        channel_scaling(scaling_rows, 400, RW, off, sc);
        const auto codec = make_kv_nuq_codec(RW, bits, per_channel, p, cb, per_channel ? off : std::vector<float>{},
                                             per_channel ? sc : std::vector<float>{});
        std::vector<uint8_t> ref(static_cast<size_t>(codec->row_bytes()));
        for (int64_t r = 0; r < RR; ++r) {
          std::vector<KVOutlier> want, got;
          int64_t clamped = 0;
          codec->encode(rnd.data() + r * RW, ref.data(), want);
          const auto bytes = mirror_nuq(rnd.data() + r * RW, RW, bits, per_channel, p, cb, off, sc, cuda_kv_outlier_capacity(p, RW), got, clamped);
          ASSERT_EQ(bytes, ref) << "random nuq" << bits << " p " << p << (per_channel ? " per-channel" : " per-token") << " row " << r;
          ASSERT_TRUE(same_outliers(got, want)) << "random outliers differ: nuq" << bits << " p " << p << " row " << r;
          ASSERT_EQ(clamped, 0);
          outliers_seen += int64_t(want.size());
        }
      }
    }
  }
  EXPECT_GT(outliers_seen, 1000);  // the outlier paths were exercised
}

TEST(CudaKVMath, OutlierCapacityBoundsAndOverflowClamps) {
  EXPECT_EQ(cuda_kv_outlier_capacity(0.0, 4096), 0);
  EXPECT_EQ(cuda_kv_outlier_capacity(0.01, 4096), 82 + 32);
  EXPECT_EQ(cuda_kv_outlier_capacity(0.01, 32), 32);  // never more than the width: cannot overflow
  // A row with more outliers than the capacity keeps the first ones and clamps the rest, which
  // then encode like the no-outlier codec (its dense codes are those of clamped values).
  const int64_t W = 256;
  std::vector<float> x(static_cast<size_t>(W));
  for (int64_t c = 0; c < W; ++c) x[size_t(c)] = (c % 2 ? 5.0f : -5.0f) + 0.01f * float(c);
  const std::vector<float> cb = sorted_codebook(4, 7, false), off(size_t(W), 0.0f), sc(size_t(W), 1.0f);
  std::vector<KVOutlier> got;
  int64_t clamped = 0;
  const int64_t cap = cuda_kv_outlier_capacity(0.01, W);
  const auto bytes = mirror_nuq(x.data(), W, 4, true, 0.01, cb, off, sc, cap, got, clamped);
  EXPECT_EQ(int64_t(got.size()), cap);
  EXPECT_EQ(clamped, W - cap);
  const auto plain = make_kv_nuq_codec(W, 4, true, 0.0, cb, off, sc);
  std::vector<uint8_t> ref(static_cast<size_t>(plain->row_bytes()));
  std::vector<KVOutlier> none;
  plain->encode(x.data(), ref.data(), none);
  for (int64_t c = cap; c < W; ++c) EXPECT_EQ(packed_get(bytes.data(), c, 4), packed_get(ref.data(), c, 4)) << c;
}

// ---- device tests ----------------------------------------------------------------------------------------

#define SQ_REQUIRE_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

/// Double-precision causal GQA attention of n queries at p0 … p0+n−1 over FP32 rows (keys rotated)
/// [p0+n, width]; also returns, per query head, the largest Σ_c |q_c·k_c|/√d over the visible keys
/// (for the error bound).
std::vector<double> reference_attention(const float* q, const float* k, const float* v, int64_t n, int64_t p0, int n_heads, int n_kv,
                                        int hd, double& max_abs_terms) {
  const int group = n_heads / n_kv;
  const int64_t kvw = int64_t(n_kv) * hd, qw = int64_t(n_heads) * hd;
  std::vector<double> out(static_cast<size_t>(n * qw), 0.0);
  max_abs_terms = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int h = 0; h < n_heads; ++h) {
      const int g = h / group;
      const int64_t rows = p0 + i + 1;
      std::vector<double> s(static_cast<size_t>(rows));
      double m = -1e300;
      for (int64_t j = 0; j < rows; ++j) {
        double d = 0, a = 0;
        for (int c = 0; c < hd; ++c) {
          const double t = double(q[i * qw + h * hd + c]) * double(k[j * kvw + g * hd + c]);
          d += t;
          a += std::fabs(t);
        }
        s[size_t(j)] = d / std::sqrt(double(hd));
        max_abs_terms = std::max(max_abs_terms, a / std::sqrt(double(hd)));
        m = std::max(m, s[size_t(j)]);
      }
      double z = 0;
      for (auto& e : s) z += (e = std::exp(e - m));
      for (int64_t j = 0; j < rows; ++j)
        for (int c = 0; c < hd; ++c) out[size_t(i * qw + h * hd + c)] += s[size_t(j)] / z * double(v[j * kvw + g * hd + c]);
    }
  return out;
}

struct FormatCase {
  std::string name;
  KVSpec spec;
};

std::vector<FormatCase> format_cases(int head_dim) {
  std::vector<FormatCase> cases;
  auto add = [&](const std::string& text, int group, double outliers, int sinks, const std::string& keys, const std::string& axis) {
    KVSpec s = parse_kv_spec(text);
    apply_kv_options(s, group, outliers, false, sinks, keys, axis);
    cases.push_back({kv_spec_name(s), s});
  };
  add("fp32", -1, -1, -1, "", "");
  add("fp32", -1, -1, -1, "pre-rope", "");
  for (const char* f : {"int8", "int4", "int3", "int2"}) {
    add(f, -1, -1, -1, "", "");         // group = head_dim
    add(f, head_dim / 2, -1, 2, "", "");  // smaller groups, 2 FP16 sinks
  }
  add("int4", -1, -1, -1, "pre-rope", "");
  for (const char* f : {"nuq4", "nuq3", "nuq2"}) {
    add(f, -1, 0.0, 0, "", "");     // no sinks, no outliers
    add(f, -1, 0.01, -1, "", "");   // 1% outliers, 1 sink (the default)
    add(f, -1, 0.05, 3, "", "");    // many outliers, 3 sinks
  }
  add("nuq4", -1, 0.01, -1, "", "per-token");
  add("nuq4", -1, 0.01, -1, "post-rope", "");
  return cases;
}

/// Random nuq parameters for a config: sorted codebooks in [−1, 1], per-channel key scaling with
/// scale ∈ [6, 10]: rows of 2·t₃ values then have about 0.7–3% per-channel outliers, well under the
/// device's per-row outlier capacity (so the bytes must match the CPU exactly).
std::vector<NuqLayerParams> random_params(const ModelConfig& c, int bits, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> sc(6.0f, 10.0f);
  std::normal_distribution<float> off(0.0f, 0.3f);
  std::vector<NuqLayerParams> p(static_cast<size_t>(c.n_layers));
  const size_t width = static_cast<size_t>(c.n_kv_heads * c.head_dim);
  for (NuqLayerParams& l : p) {
    l.key_codebook = sorted_codebook(bits, rng(), false);
    l.value_codebook = sorted_codebook(bits, rng(), false);
    l.key_offset.resize(width);
    l.key_scale.resize(width);
    for (size_t i = 0; i < width; ++i) {
      l.key_offset[i] = off(rng);
      l.key_scale[i] = sc(rng);
    }
  }
  return p;
}

/// Appends `k`/`v` rows [rows, width] per layer to a CPU KVCache and a CudaKVCache in chunks (a
/// prefill of `prefill` rows, then one row at a time) and checks after every chunk: bytes of the new
/// rows, attention of random queries (prefill: all queries causally; decode: the one query), and
/// bytes().
void check_format(const ModelConfig& c, const KVSpec& spec, const std::vector<NuqLayerParams>* params,
                  const std::vector<std::vector<float>>& k, const std::vector<std::vector<float>>& v, int64_t rows, int64_t prefill) {
  const int64_t W = int64_t(c.n_kv_heads) * c.head_dim, qw = int64_t(c.n_heads) * c.head_dim;
  KVCache cpu(c, rows, spec, params);
  CudaKVCache gpu(c, rows, spec, params);
  EXPECT_EQ(gpu.clamped_outliers(), 0);
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> kbuf, vbuf;
  int64_t p0 = 0;
  while (p0 < rows) {
    const int64_t n = p0 == 0 ? prefill : 1;
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(p0 + i);
    const DeviceArray<int32_t> dpos(pos);
    for (int l = 0; l < c.n_layers; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l) + ", rows " + std::to_string(p0) + " + " + std::to_string(n));
      std::vector<float> kk(k[size_t(l)].begin() + p0 * W, k[size_t(l)].begin() + (p0 + n) * W);
      const std::vector<float> vv(v[size_t(l)].begin() + p0 * W, v[size_t(l)].begin() + (p0 + n) * W);
      DeviceArray<float> dk(kk);
      const DeviceArray<float> dv(vv);
      gpu.append(l, dk.data(), dv.data(), n, dpos.data());
      // Post-RoPE formats: append rotated dk in place with cuda::rope, whose cosf/sinf (≤ 2 ulp)
      // and fused multiply-adds differ from ops::rope by a few ulp (checked against it with a
      // tolerance in cuda_ops_test.cpp). The CPU cache gets the device-rotated keys, so that (a)
      // compares the encoders on identical inputs (FP32 rows would otherwise differ in their bytes).
      if (!cpu.keys_pre_rope()) kk = dk.to_host();
      cpu.write(l, kk.data(), vv.data(), n);
      // (a) the device rows have the CPU codec's bytes.
      const KVCache::LayerStorage st = cpu.layer_storage(l);
      for (int64_t r = p0; r < p0 + n; ++r)
        for (bool value : {false, true}) {
          const CudaKVCache::HostRow got = gpu.row(l, value, r);
          const int32_t slot = cpu.row_slots()[r];
          if (slot < 0) {
            const uint8_t* s = (value ? st.sink_values : st.sink_keys) + size_t(-1 - slot) * size_t(2 * W);
            ASSERT_EQ(got.sink.size(), size_t(W)) << "row " << r << " is a sink on the CPU only";
            ASSERT_EQ(std::memcmp(got.sink.data(), s, size_t(2 * W)), 0) << (value ? "V" : "K") << " sink row " << r;
            continue;
          }
          const int64_t rb = value ? st.value_row_bytes : st.key_row_bytes;
          const uint8_t* d = (value ? st.values : st.keys) + size_t(slot) * size_t(rb);
          ASSERT_EQ(got.dense, std::vector<uint8_t>(d, d + rb)) << (value ? "V" : "K") << " row " << r;
          const auto* outl = value ? st.value_outliers : st.key_outliers;
          if (outl) {
            ASSERT_TRUE(same_outliers(got.outliers, (*outl)[size_t(slot)])) << (value ? "V" : "K") << " outliers of row " << r;
          }
        }
      // (b) attention: device vs double precision over the CPU cache's decoded rows.
      std::vector<float> q(static_cast<size_t>(n * qw));
      for (auto& e : q) e = nd(rng);
      const DeviceArray<float> dq(q);
      DeviceArray<float> dout(q.size());
      gpu.attend(l, dq.data(), n, dout.data());
      const std::vector<float> got = dout.to_host();
      const KVCache::View view = cpu.read(l, p0 + n, kbuf, vbuf);
      double terms = 0;
      const std::vector<double> ref = reference_attention(q.data(), view.keys, view.values, n, p0, c.n_heads, c.n_kv_heads, c.head_dim, terms);
      double vmax = 0;
      for (int64_t e = 0; e < (p0 + n) * W; ++e) vmax = std::max(vmax, double(std::fabs(view.values[e])));
      // Error bound: the device decodes the same bytes (fused multiply-adds: ≤ 2u relative per
      // element) and rotates with sincosf (≤ 2 ulp), so each key differs by ≤ 6u relative; its
      // FP32 dot over head_dim terms adds ≤ head_dim·u·Σ|q·k| and the score ≤ (head_dim + 8)·u·T,
      // T = max Σ|q_c·k_c|/√d. Softmax weights then move by ≤ 2·that (relative), plus the
      // rounding of the FP32 online-softmax sums over ≤ rows keys and split merges: ≤ (rows + 8)·u.
      // The output, a convex combination of values, moves by ≤ max|v|·(both) + 4·u·max|v|.
      const double bound = vmax * (2.0 * (c.head_dim + 8) * kU * terms + (p0 + n + 16) * kU) + 1e-30;
      double worst = 0;
      for (size_t e = 0; e < got.size(); ++e) worst = std::max(worst, std::fabs(double(got[e]) - ref[e]));
      ASSERT_LE(worst, bound) << "attention, n = " << n;
    }
    cpu.advance(n);
    gpu.advance(n);
    p0 += n;
    // (c) the same byte accounting.
    const KVCacheBytes a = gpu.bytes(), b = cpu.bytes();
    ASSERT_EQ(a.dense, b.dense);
    ASSERT_EQ(a.sinks, b.sinks);
    ASSERT_EQ(a.outliers, b.outliers);
    ASSERT_EQ(a.tables, b.tables);
  }
  EXPECT_EQ(gpu.clamped_outliers(), 0);
}

TEST(CudaKVCache, EveryFormatOnStories260KRowsMatchesCpuBytesAttentionAndAccounting) {
  SQ_REQUIRE_CUDA();
  const RealKV& kv = real_kv();
  // Real calibration: Fisher samples of 4 windows × 64 tokens, codebooks fitted per spec.
  const Checkpoint ck = load_llama2c_checkpoint(test::stories_model());
  const Decoder model = Decoder::from_checkpoint(ck);
  auto tok = load_tokenizer(test::stories_tokenizer());
  const KVFisherResult fisher = collect_kv_fisher(
      model, sample_calibration_windows(test::shared_data("tinystories/tinystories-train-2MiB.txt"), *tok, 4, 64, 9), 200, 9);
  for (const FormatCase& fc : format_cases(kv.config.head_dim)) {
    SCOPED_TRACE(fc.name);
    std::vector<NuqLayerParams> params;
    if (fc.spec.kind == KVKind::Nuq)
      for (int l = 0; l < kv.config.n_layers; ++l) params.push_back(fit_nuq_layer(fc.spec, fisher.layers[size_t(l)], kv.config, l));
    check_format(kv.config, fc.spec, fc.spec.kind == KVKind::Nuq ? &params : nullptr, kv.k, kv.v, kv.rows, 40);
    if (HasFatalFailure()) return;
  }
}

TEST(CudaKVCache, WideHeadsHalfSplitRandomRowsWithOutliersMatchCpu) {
  SQ_REQUIRE_CUDA();
  // head_dim 128 (32-lane key segments, 2 RoPE pairs per lane) and 64 (1 pair), GQA 4/2 and 8/2
  // (two query chunks of ≤ 4 heads), both RoPE layouts; heavy-tailed random rows.
  for (const int hd : {128, 64}) {
    for (const RopeLayout layout : {RopeLayout::HalfSplit, RopeLayout::Interleaved}) {
      ModelConfig c;
      c.n_heads = hd == 128 ? 4 : 10;
      c.n_kv_heads = 2;
      c.head_dim = hd;
      c.dim = c.n_heads * hd;
      c.hidden_dim = 2 * c.dim;
      c.n_layers = 2;
      c.vocab_size = 16;
      c.max_seq_len = 1024;
      c.rope_layout = layout;
      const int64_t rows = 140, W = 2 * hd;
      std::vector<std::vector<float>> k, v;
      for (int l = 0; l < 2; ++l) {
        k.push_back(random_rows(rows, W, 100u + uint32_t(l), false));
        v.push_back(random_rows(rows, W, 200u + uint32_t(l), false));
      }
      for (const FormatCase& fc : format_cases(hd)) {
        SCOPED_TRACE(fc.name + " head_dim " + std::to_string(hd) + (layout == RopeLayout::HalfSplit ? " half-split" : " interleaved"));
        const auto params = random_params(c, fc.spec.kind == KVKind::Nuq ? fc.spec.bits : 2, 31);
        check_format(c, fc.spec, fc.spec.kind == KVKind::Nuq ? &params : nullptr, k, v, rows, 120);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(CudaKVCache, RefusesLikeKVCache) {
  SQ_REQUIRE_CUDA();
  const ModelConfig& c = real_kv().config;
  const KVSpec nuq = parse_kv_spec("nuq4");
  EXPECT_THROW(CudaKVCache(c, 8, nuq, nullptr), InputError);
  KVSpec bad = parse_kv_spec("int4");
  bad.group = 5;  // does not divide the KV width 32
  EXPECT_THROW(CudaKVCache(c, 8, bad), UsageError);
  std::vector<NuqLayerParams> p(size_t(c.n_layers));
  try {
    CudaKVCache cache(c, 8, nuq, &p);
    FAIL() << "empty codebooks were accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0"), std::string::npos) << e.what();
  }
  CudaKVCache ok(c, 2, KVSpec{});
  DeviceArray<float> x(size_t(3 * ok.kv_width()));
  DeviceArray<int32_t> pos(3);
  EXPECT_THROW(ok.append(0, x.data(), x.data(), 3, pos.data()), std::length_error);
  EXPECT_THROW(ok.append(c.n_layers, x.data(), x.data(), 1, pos.data()), std::out_of_range);
  EXPECT_THROW(ok.advance(3), std::length_error);
}

}  // namespace
}  // namespace sq
