#include "quant/kv_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "formats/safetensors.h"  // float_to_half / half_to_float

namespace sq {

void kv_put_code(uint8_t* bytes, int64_t i, int bits, uint32_t value) {
  int64_t bit = i * bits;
  for (int k = 0; k < bits; ++k, ++bit) {
    uint8_t& b = bytes[bit >> 3];
    const uint8_t mask = static_cast<uint8_t>(1u << (bit & 7));
    b = static_cast<uint8_t>(((value >> k) & 1u) ? (b | mask) : (b & ~mask));
  }
}

uint32_t kv_get_code(const uint8_t* bytes, int64_t i, int bits) {
  // Read up to 16 bits starting at the code's first byte (a code of ≤ 8 bits spans ≤ 2 bytes).
  const int64_t bit = i * bits;
  const int64_t byte = bit >> 3;
  const int shift = static_cast<int>(bit & 7);
  uint32_t word = bytes[byte];
  if (shift + bits > 8) word |= static_cast<uint32_t>(bytes[byte + 1]) << 8;
  return (word >> shift) & ((1u << bits) - 1u);
}

int kv_nearest_signpost(const float* codebook, int k, float a) {
  // Midpoint thresholds: index = number of midpoints strictly below a (ties → lower signpost).
  int lo = 0, hi = k - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (a > 0.5f * (codebook[mid] + codebook[mid + 1])) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

float kv_percentile(float* v, int64_t n, double q) {
  const double pos = q * static_cast<double>(n - 1);
  const int64_t i = static_cast<int64_t>(std::floor(pos));
  const double frac = pos - static_cast<double>(i);
  std::nth_element(v, v + i, v + n);
  const float a = v[i];
  if (frac == 0.0 || i + 1 >= n) return a;
  const float b = *std::min_element(v + i + 1, v + n);
  return static_cast<float>(a + frac * (static_cast<double>(b) - a));
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
