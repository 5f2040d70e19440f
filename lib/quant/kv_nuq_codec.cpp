// KVQuant nuqX row codec (Hooper et al. 2024, §3.3 non-uniform signposts, §3.4 per-vector
// dense-and-sparse outliers, §3.7 offline per-channel / online per-token scaling).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "formats/safetensors.h"  // float_to_half / half_to_float
#include "quant/codebook_quantize.h"
#include "quant/kv_codec.h"
#include "quant/packed_bits.h"

namespace sq {
namespace {

class NuqCodec final : public KVCodec {
 public:
  NuqCodec(int64_t width, int bits, bool per_channel, double outliers, std::vector<float> codebook,
           std::vector<float> offset, std::vector<float> scale)
      : width_(width),
        bits_(bits),
        per_channel_(per_channel),
        outliers_(outliers),
        codebook_(codebook),
        quantizer_(std::move(codebook), bits),
        offset_(std::move(offset)),
        scale_(std::move(scale)),
        code_bytes_((width * bits + 7) / 8) {}

  int64_t row_bytes() const override { return code_bytes_ + (per_channel_ ? 0 : 4); }

  void encode(const float* x, uint8_t* dst, std::vector<KVOutlier>& sparse) const override {
    std::memset(dst, 0, static_cast<size_t>(row_bytes()));
    float o = 0.0f, s = 1.0f;
    if (!per_channel_) {
      kv_token_scaling(x, width_, outliers_, o, s);
      const uint16_t s16 = float_to_half(s), o16 = float_to_half(o);  // exact: already FP16 values
      std::memcpy(dst + code_bytes_, &s16, 2);
      std::memcpy(dst + code_bytes_ + 2, &o16, 2);
    }
    for (int64_t c = 0; c < width_; ++c) {
      const float oc = per_channel_ ? offset_[static_cast<size_t>(c)] : o;
      const float sc = per_channel_ ? scale_[static_cast<size_t>(c)] : s;
      const float v = std::isfinite(x[c]) ? x[c] : (x[c] > 0 ? 65504.0f : -65504.0f);
      float a = sc > 0.0f ? (v - oc) / sc : 0.0f;
      if (outliers_ > 0 && std::fabs(a) > 1.0f) {
        sparse.push_back({static_cast<uint16_t>(c), float_to_half(v)});
        continue;  // dense code stays 0; the sparse value overrides it
      }
      a = std::clamp(a, -1.0f, 1.0f);
      packed_set(dst, c, bits_, quantizer_.encode(a));
    }
  }

  void decode(const uint8_t* src, const KVOutlier* sparse, int64_t n_sparse, float* x) const override {
    float o = 0.0f, s = 1.0f;
    if (!per_channel_) {
      uint16_t s16, o16;
      std::memcpy(&s16, src + code_bytes_, 2);
      std::memcpy(&o16, src + code_bytes_ + 2, 2);
      s = half_to_float(s16);
      o = half_to_float(o16);
    }
    for (int64_t c = 0; c < width_; ++c) {
      const float a = codebook_[packed_get(src, c, bits_)];
      x[c] = per_channel_ ? a * scale_[static_cast<size_t>(c)] + offset_[static_cast<size_t>(c)] : a * s + o;
    }
    for (int64_t i = 0; i < n_sparse; ++i) x[sparse[i].channel] = half_to_float(sparse[i].value_f16);
  }

 private:
  int64_t width_;
  int bits_;
  bool per_channel_;
  double outliers_;
  std::vector<float> codebook_;
  CodebookQuantizer quantizer_;  ///< nearest signpost (ties to the lower index)
  std::vector<float> offset_, scale_;
  int64_t code_bytes_;
};

}  // namespace

std::unique_ptr<KVCodec> make_kv_nuq_codec(int64_t width, int bits, bool per_channel, double outlier_fraction,
                                           std::vector<float> codebook, std::vector<float> offset,
                                           std::vector<float> scale) {
  if (bits < 1 || bits > 8) throw std::invalid_argument("nuq KV codec: bits must be in [1, 8], got " + std::to_string(bits));
  if (static_cast<int64_t>(codebook.size()) != (int64_t(1) << bits))
    throw std::invalid_argument("nuq KV codec: codebook has " + std::to_string(codebook.size()) + " entries, expected " +
                                std::to_string(1 << bits) + " for nuq" + std::to_string(bits));
  for (size_t i = 0; i < codebook.size(); ++i)
    if (!std::isfinite(codebook[i]) || (i > 0 && codebook[i] < codebook[i - 1]))
      throw std::invalid_argument("nuq KV codec: codebook entries must be finite and sorted ascending");
  if (per_channel) {
    if (static_cast<int64_t>(offset.size()) != width || static_cast<int64_t>(scale.size()) != width)
      throw std::invalid_argument("nuq KV codec: per-channel key scaling must have " + std::to_string(width) +
                                  " offsets and scales, got " + std::to_string(offset.size()) + " and " +
                                  std::to_string(scale.size()));
    for (size_t c = 0; c < scale.size(); ++c)
      if (!std::isfinite(offset[c]) || !std::isfinite(scale[c]) || scale[c] < 0.0f)
        throw std::invalid_argument("nuq KV codec: key channel " + std::to_string(c) + " has a non-finite offset or a negative scale");
  }
  if (!(outlier_fraction >= 0 && outlier_fraction < 0.5))
    throw std::invalid_argument("nuq KV codec: outlier fraction must be in [0, 0.5)");
  return std::make_unique<NuqCodec>(width, bits, per_channel, outlier_fraction, std::move(codebook), std::move(offset),
                                    std::move(scale));
}

}  // namespace sq
