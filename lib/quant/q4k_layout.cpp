#include "quant/q4k_layout.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "formats/gguf_dequantize.h"
#include "formats/safetensors.h"

namespace sq {

void pack_q4k_scales(const uint8_t sc[8], const uint8_t mi[8], uint8_t out[12]) {
  for (int j = 0; j < 8; ++j)
    if (sc[j] > 63 || mi[j] > 63)
      throw std::invalid_argument("Q4_K: sub-block " + std::to_string(j) + " scale " + std::to_string(sc[j]) + " / min " +
                                  std::to_string(mi[j]) + " does not fit 6 bits");
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
    out[j + 4] = static_cast<uint8_t>(mi[j] | (mi[j + 4] >> 4) << 6);
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | (mi[j + 4] & 15) << 4);
  }
}

void expand_q4k_scales(Int4Weights& w) {
  if (w.group != 32 || !w.asym) throw std::invalid_argument("Q4_K scales need g = 32 and unsigned codes");
  const int64_t ng = int4_groups_per_row(w), nsb = q4k_superblocks(ng);
  if (static_cast<int64_t>(w.superblock_scales.size()) != w.out * nsb * kQ4kHeadBytes)
    throw std::invalid_argument("Q4_K scales: " + std::to_string(w.superblock_scales.size()) + " bytes, expected " +
                                std::to_string(w.out * nsb * kQ4kHeadBytes));
  w.scales_f16.assign(static_cast<size_t>(w.out * ng), 0);
  w.mins_f16.assign(static_cast<size_t>(w.out * ng), 0);
  w.zeros_packed.clear();
  for (int64_t r = 0; r < w.out; ++r)
    for (int64_t b = 0; b < nsb; ++b) {
      const uint8_t* h = w.superblock_scales.data() + (r * nsb + b) * kQ4kHeadBytes;
      uint16_t d16, m16;
      std::memcpy(&d16, h, 2);
      std::memcpy(&m16, h + 2, 2);
      const float d = half_to_float(d16), dmin = half_to_float(m16);
      if (!std::isfinite(d) || !std::isfinite(dmin))
        throw std::invalid_argument("Q4_K scales: row " + std::to_string(r) + " super-block " + std::to_string(b) + ": d or dmin not finite");
      for (int64_t j = b * kQ4kGroups; j < std::min(ng, (b + 1) * kQ4kGroups); ++j) {
        int sc, mi;
        k_quant_unpack_scale_min(h + 4, static_cast<int>(j - b * kQ4kGroups), sc, mi);
        const float delta = d * static_cast<float>(sc), m = -dmin * static_cast<float>(mi);  // exact in FP32
        const uint16_t dh = float_to_half(delta), mh = float_to_half(m);
        if (half_to_float(dh) != delta || half_to_float(mh) != m)
          throw std::invalid_argument("Q4_K scales: row " + std::to_string(r) + " group " + std::to_string(j) + ": d·sc = " +
                                      std::to_string(delta) + " or dmin·mi = " + std::to_string(m) +
                                      " is not an FP16 value (sqkit's kernels need exact FP16 steps)");
        w.scales_f16[static_cast<size_t>(r * ng + j)] = dh;
        w.mins_f16[static_cast<size_t>(r * ng + j)] = mh;
      }
    }
}

void q4k_gguf_block(const uint8_t head[kQ4kHeadBytes], const uint8_t codes[kQ4kColumns / 2], uint8_t out[kQ4kBlockBytes]) {
  std::memcpy(out, head, kQ4kHeadBytes);
  const auto code = [&](int c) { return (c & 1) ? codes[c / 2] >> 4 : codes[c / 2] & 15; };
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      out[kQ4kHeadBytes + 32 * c + l] = static_cast<uint8_t>(code(64 * c + l) | code(64 * c + 32 + l) << 4);
}

}  // namespace sq
