#include "quant/kv_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "formats/safetensors.h"  // float_to_half / half_to_float

namespace sq {

float kv_percentile(float* v, int64_t n, double q) {
  const double pos = q * static_cast<double>(n - 1);
  const int64_t i = static_cast<int64_t>(std::floor(pos));
  const double frac = pos - static_cast<double>(i);
  std::nth_element(v, v + i, v + n);
  const float a = v[i];
  if (frac == 0.0 || i + 1 >= n) return a;
  const float b = *std::min_element(v + i + 1, v + n);
  // One explicit fused multiply-add, so the result does not depend on the compiler's contraction
  // flags and the CUDA encoder (cuda/kv_device_math.h, lerp_percentile) computes the same value.
  return static_cast<float>(std::fma(frac, static_cast<double>(b) - a, static_cast<double>(a)));
}

void kv_token_scaling(const float* x, int64_t width, double outlier_fraction, float& offset, float& scale) {
  thread_local std::vector<float> tmp;
  tmp.clear();
  for (int64_t c = 0; c < width; ++c)
    if (std::isfinite(x[c])) tmp.push_back(x[c]);
  float lo = 0.0f, hi = 0.0f;
  if (!tmp.empty()) {
    const int64_t n = static_cast<int64_t>(tmp.size());
    if (outlier_fraction > 0) {
      lo = kv_percentile(tmp.data(), n, outlier_fraction / 2);
      hi = kv_percentile(tmp.data(), n, 1.0 - outlier_fraction / 2);
    } else {
      const auto [mn, mx] = std::minmax_element(tmp.begin(), tmp.end());
      lo = *mn;
      hi = *mx;
    }
  }
  offset = half_to_float(float_to_half(0.5f * (hi + lo)));
  scale = half_to_float(float_to_half(0.5f * (hi - lo)));
}

namespace {

class F32Codec final : public KVCodec {
 public:
  explicit F32Codec(int64_t width) : width_(width) {}
  int64_t row_bytes() const override { return 4 * width_; }
  void encode(const float* x, uint8_t* dst, std::vector<KVOutlier>&) const override {
    std::memcpy(dst, x, static_cast<size_t>(width_) * 4);
  }
  void decode(const uint8_t* src, const KVOutlier*, int64_t, float* x) const override {
    std::memcpy(x, src, static_cast<size_t>(width_) * 4);
  }

 private:
  int64_t width_;
};

class F16Codec final : public KVCodec {
 public:
  explicit F16Codec(int64_t width) : width_(width) {}
  int64_t row_bytes() const override { return 2 * width_; }
  void encode(const float* x, uint8_t* dst, std::vector<KVOutlier>&) const override {
    for (int64_t c = 0; c < width_; ++c) {
      const uint16_t h = float_to_half(x[c]);
      std::memcpy(dst + 2 * c, &h, 2);
    }
  }
  void decode(const uint8_t* src, const KVOutlier*, int64_t, float* x) const override {
    for (int64_t c = 0; c < width_; ++c) {
      uint16_t h;
      std::memcpy(&h, src + 2 * c, 2);
      x[c] = half_to_float(h);
    }
  }

 private:
  int64_t width_;
};

}  // namespace

std::unique_ptr<KVCodec> make_kv_f16_codec(int64_t width) { return std::make_unique<F16Codec>(width); }

std::unique_ptr<KVCodec> make_kv_codec(const KVSpec& spec, int64_t width, int64_t head_dim, bool is_value,
                                       const NuqLayerParams* params) {
  switch (spec.kind) {
    case KVKind::F32: return std::make_unique<F32Codec>(width);
    case KVKind::Int: return make_kv_uniform_codec(width, spec.group > 0 ? spec.group : head_dim, spec.bits);
    case KVKind::Nuq: {
      if (!params) throw std::invalid_argument("nuq KV codec: the layer's codebooks are missing");
      const bool per_channel = !is_value && spec.key_axis == KVKeyAxis::PerChannel;
      return make_kv_nuq_codec(width, spec.bits, per_channel, spec.outlier_fraction,
                               is_value ? params->value_codebook : params->key_codebook,
                               per_channel ? params->key_offset : std::vector<float>{},
                               per_channel ? params->key_scale : std::vector<float>{});
    }
  }
  throw std::invalid_argument("unknown KV format");
}

}  // namespace sq
