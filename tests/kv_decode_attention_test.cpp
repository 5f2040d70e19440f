// Fused decode attention over nuq KV caches (runtime/kv_decode_attention.h) against the generic
// path: KVCache::read (dequantize + RoPE) followed by a double-precision attention, on random data
// for every supported variant, and whole-model token-by-token decoding against Decoder's sgemm
// attention path (stories260K: scalar kernel, head_dim 8; a synthetic model: the SIMD kernel).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "formats/llama2c_checkpoint.h"
#include "model/decoder.h"
#include "model/synthetic.h"
#include "ops/ops.h"
#include "quant/kv_codec.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_decode_attention.h"
#include "support/test_data.h"

namespace sq {
namespace {

ModelConfig attention_config(int n_heads, int n_kv_heads, int head_dim, RopeLayout layout) {
  ModelConfig c;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = head_dim;
  c.dim = n_heads * head_dim;
  c.hidden_dim = 2 * c.dim;
  c.n_layers = 2;
  c.vocab_size = 16;
  c.max_seq_len = 512;
  c.rope_layout = layout;
  return c;
}

/// Random nuq parameters: a sorted codebook of 2^b entries in [−1, 1] and per-channel key scaling
/// (offset ~ N(0, 0.3²), scale ∈ [0.8, 2.5]) for every layer.
std::vector<NuqLayerParams> random_nuq(const ModelConfig& c, int bits, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), sc(0.8f, 2.5f);
  std::normal_distribution<float> off(0.0f, 0.3f);
  std::vector<NuqLayerParams> p(static_cast<size_t>(c.n_layers));
  const size_t width = static_cast<size_t>(c.n_kv_heads * c.head_dim);
  for (NuqLayerParams& l : p) {
    for (auto* cb : {&l.key_codebook, &l.value_codebook}) {
      cb->resize(size_t(1) << bits);
      for (float& v : *cb) v = u(rng);
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

/// Double-precision decode attention of q [n_heads·hd] over FP32 keys (already rotated) and
/// values [rows, n_kv·hd]: the definition softmax(q·Kᵀ/√d)·V per head, GQA head h → h / group.
std::vector<double> reference_attention(const float* q, const float* k, const float* v, int64_t rows, int n_heads,
                                        int n_kv, int hd) {
  const int group = n_heads / n_kv;
  const int64_t kvw = int64_t(n_kv) * hd;
  std::vector<double> out(static_cast<size_t>(n_heads * hd), 0.0), s(static_cast<size_t>(rows));
  for (int h = 0; h < n_heads; ++h) {
    const int g = h / group;
    double m = -1e300;
    for (int64_t j = 0; j < rows; ++j) {
      double d = 0;
      for (int c = 0; c < hd; ++c) d += double(q[h * hd + c]) * double(k[j * kvw + g * hd + c]);
      s[size_t(j)] = d / std::sqrt(double(hd));
      m = std::max(m, s[size_t(j)]);
    }
    double z = 0;
    for (int64_t j = 0; j < rows; ++j) z += (s[size_t(j)] = std::exp(s[size_t(j)] - m));
    for (int64_t j = 0; j < rows; ++j)
      for (int c = 0; c < hd; ++c) out[size_t(h * hd + c)] += s[size_t(j)] / z * double(v[j * kvw + g * hd + c]);
  }
  return out;
}

struct Variant {
  int bits;
  RopeLayout layout;
  int n_heads, n_kv, hd;
  int sinks;
  double outliers;
  KVKeyAxis key_axis;
  KVKeyRope keys;
  bool evict;  ///< drop rows so that stored rotations differ from cache positions
};

std::string name(const Variant& v) {
  return "nuq" + std::to_string(v.bits) + (v.layout == RopeLayout::Interleaved ? " interleaved" : " half-split") + " heads " +
         std::to_string(v.n_heads) + "/" + std::to_string(v.n_kv) + " hd " + std::to_string(v.hd) + " sinks " +
         std::to_string(v.sinks) + " outliers " + std::to_string(v.outliers) +
         (v.key_axis == KVKeyAxis::PerToken ? " per-token keys" : "") + (v.keys == KVKeyRope::PostRope ? " post-rope" : "") +
         (v.evict ? " evicted" : "");
}

/// Fills a cache of the variant with random rows, then compares both kernel paths with the
/// double-precision reference over KVCache::read's rows, for every layer.
void check_variant(const Variant& v) {
  SCOPED_TRACE(name(v));
  const ModelConfig c = attention_config(v.n_heads, v.n_kv, v.hd, v.layout);
  KVSpec spec = parse_kv_spec("nuq" + std::to_string(v.bits));
  spec.sink_fp16 = v.sinks;
  spec.outlier_fraction = v.outliers;
  spec.key_axis = v.key_axis;
  spec.keys = v.keys;
  const auto params = random_nuq(c, v.bits, 11u + static_cast<uint32_t>(v.bits));
  const int64_t n = 150, width = int64_t(v.n_kv) * v.hd;
  KVCache cache(c, n + 8, spec, &params);
  std::mt19937 rng(7);
  std::student_t_distribution<float> t3(3.0f);  // heavy-tailed like K/V activations
  std::vector<float> k(static_cast<size_t>(n * width)), val(k.size());
  for (float& x : k) x = 1.2f * t3(rng);
  for (float& x : val) x = t3(rng);
  if (v.keys == KVKeyRope::PostRope) {  // the model rotates post-RoPE keys before writing them
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = static_cast<int32_t>(i);
    ops::rope(k.data(), pos.data(), n, v.n_kv, v.hd, c.rope_theta, c.rope_layout);
  }
  for (int l = 0; l < c.n_layers; ++l) cache.write(l, k.data(), val.data(), n);
  cache.advance(n);
  if (v.evict) {
    std::vector<int64_t> keep;
    for (int64_t r = 0; r < n; ++r)
      if (r < 4 || r % 3 != 1) keep.push_back(r);
    cache.keep_rows(keep);
  }
  const int64_t rows = cache.length();
  std::vector<float> q(static_cast<size_t>(v.n_heads * v.hd));
  for (float& x : q) x = t3(rng);
  std::vector<int32_t> qpos = {static_cast<int32_t>(rows - 1)};
  ops::rope(q.data(), qpos.data(), 1, v.n_heads, v.hd, c.rope_theta, c.rope_layout);
#if defined(__AVX512F__)
  EXPECT_TRUE(nuq_decode_attention_uses_simd(cache, v.n_heads));
#endif
  for (int l = 0; l < c.n_layers; ++l) {
    std::vector<float> kb, vb;
    const KVCache::View view = cache.read(l, rows, kb, vb);
    const std::vector<double> ref = reference_attention(q.data(), view.keys, view.values, rows, v.n_heads, v.n_kv, v.hd);
    double vmax = 0;
    for (int64_t i = 0; i < rows * width; ++i) vmax = std::max(vmax, double(std::fabs(view.values[i])));
    for (KVDecodeIsa isa : {KVDecodeIsa::Auto, KVDecodeIsa::Scalar}) {
      KVDecodeScratch scratch;
      std::vector<float> out(q.size(), -1.0f);
      std::vector<double> mass;
      ASSERT_TRUE(nuq_decode_attention(cache, l, rows, q.data(), v.n_heads, out.data(), scratch, &mass, isa));
      double err = 0;
      for (size_t i = 0; i < out.size(); ++i) err = std::max(err, std::fabs(double(out[i]) - ref[i]));
      // Both sides decode the same codes; they differ only in FP32 rounding (summation order of
      // the 32–128-term scores, RoPE applied to scaled vs unscaled terms, softmax). A score error
      // of ~1e−6 moves each probability by ~1e−6 relatively, and the output is a convex
      // combination of values: error ~1e−6·max|v| (measured ≤ 3.6e−7·max|v| over all variants).
      // 1e−5·max|v| leaves margin; a wrong code, rotation, sink or outlier gives ≥ 1e−2·max|v|.
      EXPECT_LT(err, 1e-5 * vmax) << (isa == KVDecodeIsa::Auto ? "auto" : "scalar") << " layer " << l << " err " << err;
      // Attention mass: Σ_j Σ_h p_hj = n_heads (every head's probabilities sum to 1).
      ASSERT_EQ(static_cast<int64_t>(mass.size()), rows);
      double total = 0;
      for (double m : mass) total += m;
      EXPECT_NEAR(total, v.n_heads, 1e-4 * v.n_heads);  // FP32 softmax sums: ~1e−6 per head
    }
  }
}

TEST(KVDecodeAttention, FusedMatchesDequantizedReferenceOnRandomRows) {
  const auto IL = RopeLayout::Interleaved, HS = RopeLayout::HalfSplit;
  const auto PC = KVKeyAxis::PerChannel, PT = KVKeyAxis::PerToken;
  const auto PRE = KVKeyRope::PreRope, POST = KVKeyRope::PostRope;
  const Variant variants[] = {
      {4, IL, 4, 4, 64, 0, 0.0, PC, PRE, false},     // MHA, no sinks
      {4, IL, 8, 2, 64, 1, 0.0, PC, PRE, false},     // GQA 4:1, one sink
      {3, IL, 8, 2, 64, 2, 0.0, PC, PRE, false},
      {2, IL, 6, 3, 32, 1, 0.0, PC, PRE, false},
      {4, HS, 8, 2, 64, 1, 0.0, PC, PRE, false},
      {3, HS, 4, 4, 64, 0, 0.0, PC, PRE, false},
      {2, HS, 8, 4, 64, 1, 0.0, PC, PRE, false},
      {4, IL, 8, 2, 64, 1, 0.02, PC, PRE, false},    // sparse outliers (keys and values)
      {3, HS, 8, 2, 64, 1, 0.05, PC, PRE, false},
      {4, IL, 4, 2, 64, 1, 0.0, PT, PRE, false},     // per-token keys
      {4, HS, 4, 2, 128, 1, 0.01, PT, POST, true},   // post-RoPE keys after eviction: δ ≠ row
      {3, IL, 8, 2, 64, 1, 0.0, PC, PRE, true},      // pre-RoPE keys after eviction
  };
  for (const Variant& v : variants) check_variant(v);
}

TEST(KVDecodeAttention, DeclinesNonNuqCaches) {
  const ModelConfig c = attention_config(4, 2, 32, RopeLayout::Interleaved);
  KVCache f32(c, 8);
  KVCache int4(c, 8, parse_kv_spec("int4"));
  std::vector<float> row(64, 0.5f), q(128, 0.1f), out(128, 7.0f);
  KVDecodeScratch scratch;
  for (KVCache* cache : {&f32, &int4}) {
    cache->write(0, row.data(), row.data(), 1);
    EXPECT_FALSE(nuq_decode_attention(*cache, 0, 1, q.data(), 4, out.data(), scratch));
    EXPECT_EQ(out[0], 7.0f);  // untouched
  }
  const auto params = random_nuq(c, 4, 3);
  KVCache nuq(c, 8, parse_kv_spec("nuq4"), &params);
  nuq.write(0, row.data(), row.data(), 1);
  EXPECT_FALSE(nuq_decode_attention(nuq, 0, 1, q.data(), 3, out.data(), scratch));  // 3 heads over 2 KV heads
  EXPECT_THROW(nuq_decode_attention(nuq, 0, 2, q.data(), 4, out.data(), scratch), std::out_of_range);
  EXPECT_THROW(nuq_decode_attention(nuq, 5, 1, q.data(), 4, out.data(), scratch), std::out_of_range);
}

/// Decodes `steps` tokens one at a time with the fused kernel and with the generic path (each on
/// its own nuq cache) and returns the largest |Δ logit| relative to the largest |logit|.
double decode_difference(const Decoder& model, const std::vector<NuqLayerParams>& params, const KVSpec& spec,
                         const std::vector<int32_t>& tokens, bool& fused_ran) {
  const ModelConfig& c = model.config();
  const int64_t steps = static_cast<int64_t>(tokens.size());
  KVCache fused(c, steps, spec, &params), generic(c, steps, spec, &params);
  Workspace wf, wg;
  wg.fused_decode_attention = false;
  std::vector<float> lf(static_cast<size_t>(c.vocab_size)), lg(lf.size());
  double err = 0, scale = 0;
  for (int64_t t = 0; t < steps; ++t) {
    model.forward(&tokens[size_t(t)], 1, fused, wf, lf.data(), LogitsFor::LastToken);
    model.forward(&tokens[size_t(t)], 1, generic, wg, lg.data(), LogitsFor::LastToken);
    for (size_t i = 0; i < lf.size(); ++i) {
      err = std::max(err, double(std::fabs(lf[i] - lg[i])));
      scale = std::max(scale, double(std::fabs(lg[i])));
    }
  }
  fused_ran = wf.kv_decode.rope_positions >= steps && wg.kv_decode.rope_positions == 0;
  return err / scale;
}

// Both caches hold the same quantized rows up to FP32 rounding of the hidden states (the two
// paths sum in different orders; measured max logit differences 3e−7 to 2e−5 of the logit scale). Such a difference moves a code across a signpost midpoint with probability ~1e−5 per
// element and flips the FP16 rounding of a row's per-token value scale (one FP16 ulp, 1e−3
// relative) with probability ~1e−3 per row; either changes the logits by well under 1e−3 of
// their scale, which is the bound. A wrong row, rotation or scale changes them by percent.
// Sparse outliers are left to the random-data test: whether an element is an outlier and its
// FP16 value are discrete decisions that a 1e−6 change in the hidden state can flip (observed:
// an FP16 outlier value one ulp apart after 4 steps), after which the two decodes diverge for
// reasons unrelated to the kernel.
TEST(KVDecodeAttention, Stories260KTokenByTokenMatchesGenericPath) {
  const Decoder model = Decoder::from_checkpoint(load_llama2c_checkpoint(test::stories_model()));
  const ModelConfig& c = model.config();
  std::mt19937 rng(3);
  std::vector<int32_t> tokens(100);
  tokens[0] = c.bos_id;
  for (size_t i = 1; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(3 + rng() % (c.vocab_size - 3));
  for (int bits : {4, 3, 2}) {
    SCOPED_TRACE("nuq" + std::to_string(bits));
    // Key scaling ±3 around 0 per channel: stories260K's pre-RoPE keys mostly lie within it.
    std::vector<NuqLayerParams> params = random_nuq(c, bits, 5);
    for (NuqLayerParams& p : params) {
      std::fill(p.key_offset.begin(), p.key_offset.end(), 0.0f);
      std::fill(p.key_scale.begin(), p.key_scale.end(), 3.0f);
    }
    KVSpec spec = parse_kv_spec("nuq" + std::to_string(bits));  // pre-RoPE keys, 1 FP16 sink
    bool fused_ran = false;
    const double rel = decode_difference(model, params, spec, tokens, fused_ran);
    EXPECT_TRUE(fused_ran);
    EXPECT_LT(rel, 1e-3) << rel;
  }
}

// The same on a synthetic model whose head_dim (64) takes the AVX-512 path, with half-split RoPE.
TEST(KVDecodeAttention, SyntheticModelTokenByTokenMatchesGenericPath) {
  ModelConfig c = attention_config(4, 2, 64, RopeLayout::HalfSplit);
  c.vocab_size = 64;
  c.hidden_dim = 256;
  c.n_layers = 2;
  const Decoder model = Decoder::from_checkpoint(make_synthetic_checkpoint(c, 9));
  std::vector<int32_t> tokens(80);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + 1) % 64);
  const std::vector<NuqLayerParams> params = random_nuq(c, 3, 8);
  KVCache probe(c, 1, parse_kv_spec("nuq3"), &params);
#if defined(__AVX512F__)
  EXPECT_TRUE(nuq_decode_attention_uses_simd(probe, c.n_heads));
#endif
  bool fused_ran = false;
  const double rel = decode_difference(model, params, parse_kv_spec("nuq3"), tokens, fused_ran);
  EXPECT_TRUE(fused_ran);
  EXPECT_LT(rel, 1e-3) << rel;  // as above
}

}  // namespace
}  // namespace sq
