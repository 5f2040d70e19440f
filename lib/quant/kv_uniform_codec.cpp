// Uniform per-token asymmetric KV quantization (Atom §4.4; the int baselines of KVQuant Table 2).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "formats/safetensors.h"  // float_to_half / half_to_float
#include "quant/kv_codec.h"
#include "quant/packed_bits.h"

namespace sq {
namespace {

class UniformCodec final : public KVCodec {
 public:
  UniformCodec(int64_t width, int64_t group, int bits)
      : width_(width), group_(group), bits_(bits), code_bytes_((width * bits + 7) / 8) {}

  int64_t row_bytes() const override { return code_bytes_ + 4 * (width_ / group_); }

  void encode(const float* x, uint8_t* dst, std::vector<KVOutlier>&) const override {
    std::memset(dst, 0, static_cast<size_t>(code_bytes_));
    const float qmax = static_cast<float>((1 << bits_) - 1);
    uint8_t* meta = dst + code_bytes_;
    for (int64_t g0 = 0, j = 0; g0 < width_; g0 += group_, ++j) {
      float lo = INFINITY, hi = -INFINITY;
      for (int64_t c = g0; c < g0 + group_; ++c) {
        if (!std::isfinite(x[c])) continue;
        lo = std::min(lo, x[c]);
        hi = std::max(hi, x[c]);
      }
      if (!(lo <= hi)) lo = hi = 0.0f;  // no finite value in the group
      // Δ and z as stored (FP16), so that decoding reproduces exactly the grid encoding used.
      const uint16_t z16 = float_to_half(lo);
      const float z = half_to_float(z16);
      uint16_t d16 = float_to_half((hi - z) / qmax);
      float delta = half_to_float(d16);
      // FP16 rounding of Δ down could leave max outside the grid; the clamp below handles it.
      if (!(delta > 0.0f) || !std::isfinite(delta)) {
        delta = 0.0f;
        d16 = 0;
      }
      std::memcpy(meta + 4 * j, &d16, 2);
      std::memcpy(meta + 4 * j + 2, &z16, 2);
      for (int64_t c = g0; c < g0 + group_; ++c) {
        float q = 0.0f;
        if (delta > 0.0f) {
          const float v = std::isfinite(x[c]) ? x[c] : (x[c] > 0 ? hi : lo);
          q = std::clamp(std::nearbyint((v - z) / delta), 0.0f, qmax);
        }
        packed_set(dst, c, bits_, static_cast<uint8_t>(q));
      }
    }
  }

  void decode(const uint8_t* src, const KVOutlier*, int64_t, float* x) const override {
    const uint8_t* meta = src + code_bytes_;
    for (int64_t g0 = 0, j = 0; g0 < width_; g0 += group_, ++j) {
      uint16_t d16, z16;
      std::memcpy(&d16, meta + 4 * j, 2);
      std::memcpy(&z16, meta + 4 * j + 2, 2);
      const float delta = half_to_float(d16), z = half_to_float(z16);
      for (int64_t c = g0; c < g0 + group_; ++c) x[c] = z + static_cast<float>(packed_get(src, c, bits_)) * delta;
    }
  }

 private:
  int64_t width_, group_;
  int bits_;
  int64_t code_bytes_;
};

}  // namespace

std::unique_ptr<KVCodec> make_kv_uniform_codec(int64_t width, int64_t group, int bits) {
  if (bits < 1 || bits > 8) throw std::invalid_argument("uniform KV codec: bits must be in [1, 8], got " + std::to_string(bits));
  if (group <= 0 || width <= 0 || width % group != 0)
    throw std::invalid_argument("uniform KV codec: group " + std::to_string(group) + " does not divide width " +
                                std::to_string(width));
  return std::make_unique<UniformCodec>(width, group, bits);
}

}  // namespace sq
