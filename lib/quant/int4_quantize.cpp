#include "quant/int4_quantize.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "formats/safetensors.h"
#include "quant/q4k_layout.h"

namespace sq {

namespace {

constexpr int64_t kParallelMinElements = int64_t(1) << 22;

}  // namespace

void check_int4_shape(int64_t out, int64_t in, int64_t group) {
  if (group != 32 && group != 64 && group != 128)
    throw std::invalid_argument("INT4 quantization: group size g = " + std::to_string(group) +
                                " is not supported (expected 32, 64 or 128; in = " + std::to_string(in) + ")");
  if (out <= 0 || in <= 0)
    throw std::invalid_argument("INT4 quantization: weight shape [" + std::to_string(out) + ", " + std::to_string(in) +
                                "] must be non-empty");
  if (in % 2 != 0)
    throw std::invalid_argument("INT4 quantization: the input dimension in = " + std::to_string(in) +
                                " must be even (two 4-bit codes per byte)");
}

Int4Weights quantize_int4(const float* w, int64_t out, int64_t in, int64_t group, bool asym) {
  check_int4_shape(out, in, group);
  const int64_t ng = (in + group - 1) / group;
  Int4Weights r;
  r.out = out;
  r.in = in;
  r.group = group;
  r.asym = asym;
  r.packed.assign(static_cast<size_t>(out * in / 2), 0);
  r.scales_f16.assign(static_cast<size_t>(out * ng), 0);
  std::vector<uint8_t> zeros(asym ? static_cast<size_t>(out * ng) : 0, 0);
  bool bad_value = false, overflow = false;
  uint8_t* const packed = r.packed.mutable_data();
#pragma omp parallel for schedule(static) reduction(|| : bad_value, overflow) if (out * in >= kParallelMinElements && out > 1)
  for (int64_t row = 0; row < out; ++row) {
    const float* wr = w + row * in;
    uint8_t* pr = packed + row * (in / 2);
    for (int64_t j = 0; j < ng; ++j) {
      const float* wg = wr + j * group;
      const int64_t len = std::min(group, in - j * group);  // the last group may be shorter
      float lo = 0.0f, hi = 0.0f, amax = 0.0f;
      for (int64_t k = 0; k < len; ++k) {
        const float v = wg[k];
        if (!std::isfinite(v)) bad_value = true;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
        amax = std::max(amax, std::fabs(v));
      }
      const float step = asym ? (hi - lo) / 15.0f : amax / 7.0f;
      const uint16_t h = float_to_half(step);
      const float d = half_to_float(h);
      if (!std::isfinite(d)) overflow = true;
      r.scales_f16[static_cast<size_t>(row * ng + j)] = h;
      int z = 0;
      if (asym && d > 0.0f) z = static_cast<int>(std::clamp(std::round(-lo / d), 0.0f, 15.0f));
      if (asym) zeros[static_cast<size_t>(row * ng + j)] = static_cast<uint8_t>(z);
      for (int64_t k = 0; k < len; ++k) {
        int q = 0;
        if (d > 0.0f && std::isfinite(d)) {
          const float t = std::round(wg[k] / d);
          q = asym ? static_cast<int>(std::clamp(t + static_cast<float>(z), 0.0f, 15.0f))
                   : static_cast<int>(std::clamp(t, -8.0f, 7.0f));
        } else if (asym) {
          q = z;
        }
        const int64_t c = j * group + k;
        const uint8_t nib = static_cast<uint8_t>(q & 0xF);
        pr[c / 2] |= static_cast<uint8_t>((c & 1) ? nib << 4 : nib);
      }
    }
  }
  if (bad_value) throw std::invalid_argument("INT4 quantization: the weight holds NaN or inf");
  if (overflow) throw std::invalid_argument("INT4 quantization: a group's step Δ overflows FP16 (|w| too large)");
  if (asym) {
    r.zeros_packed.assign(static_cast<size_t>((out * ng + 1) / 2), 0);
    for (size_t f = 0; f < zeros.size(); ++f) r.zeros_packed[f / 2] |= static_cast<uint8_t>((f & 1) ? zeros[f] << 4 : zeros[f]);
  }
  return r;
}

void validate_int4(const Int4Weights& w) {
  check_int4_shape(w.out, w.in, w.group);
  const int64_t ng = int4_groups_per_row(w);
  auto fail = [&](const std::string& what, size_t got, int64_t want) {
    throw std::invalid_argument("Int4Weights [" + std::to_string(w.out) + ", " + std::to_string(w.in) + "] g" +
                                std::to_string(w.group) + ": " + what + " has " + std::to_string(got) + " entries, expected " +
                                std::to_string(want));
  };
  if (static_cast<int64_t>(w.packed.size()) != w.out * w.in / 2) fail("packed", w.packed.size(), w.out * w.in / 2);
  if (static_cast<int64_t>(w.scales_f16.size()) != w.out * ng) fail("scales_f16", w.scales_f16.size(), w.out * ng);
  if (w.float_min()) {
    if (!w.asym) throw std::invalid_argument("Int4Weights: a float minimum needs asymmetric (unsigned) codes");
    if (static_cast<int64_t>(w.mins_f16.size()) != w.out * ng) fail("mins_f16", w.mins_f16.size(), w.out * ng);
    if (!w.zeros_packed.empty()) fail("zeros_packed (float minimum)", w.zeros_packed.size(), 0);
    for (const uint16_t h : w.mins_f16)
      if (!std::isfinite(half_to_float(h))) throw std::invalid_argument("Int4Weights: a float minimum is not finite");
  } else {
    const int64_t nz = w.asym ? (w.out * ng + 1) / 2 : 0;
    if (static_cast<int64_t>(w.zeros_packed.size()) != nz) fail("zeros_packed", w.zeros_packed.size(), nz);
  }
  if (w.k_quant()) {
    if (w.group != 32 || !w.float_min())
      throw std::invalid_argument("Int4Weights: K-quant scales need g = 32 and a float minimum (GGML's Q4_K)");
    const int64_t bytes = w.out * q4k_superblocks(ng) * kQ4kHeadBytes;
    if (static_cast<int64_t>(w.superblock_scales.size()) != bytes) fail("superblock_scales", w.superblock_scales.size(), bytes);
  }
  for (const uint16_t h : w.scales_f16) {
    const float d = half_to_float(h);
    if (!std::isfinite(d) || (w.asym && d < 0.0f))
      throw std::invalid_argument("Int4Weights: scale " + std::to_string(d) + (w.asym ? " is negative or not finite" : " is not finite"));
  }
}

int int4_code(const Int4Weights& w, int64_t r, int64_t c) {
  const uint8_t b = w.packed[static_cast<size_t>(r * (w.in / 2) + c / 2)];
  const int nib = (c & 1) ? (b >> 4) : (b & 0xF);
  return w.asym ? nib : (nib ^ 8) - 8;
}

int int4_zero(const Int4Weights& w, int64_t r, int64_t j) {
  if (!w.asym || w.float_min()) return 0;
  const int64_t f = r * int4_groups_per_row(w) + j;
  const uint8_t b = w.zeros_packed[static_cast<size_t>(f / 2)];
  return (f & 1) ? (b >> 4) : (b & 0xF);
}

float int4_scale(const Int4Weights& w, int64_t r, int64_t j) {
  return half_to_float(w.scales_f16[static_cast<size_t>(r * int4_groups_per_row(w) + j)]);
}

float int4_offset(const Int4Weights& w, int64_t r, int64_t j) {
  if (w.float_min()) return half_to_float(w.mins_f16[static_cast<size_t>(r * int4_groups_per_row(w) + j)]);
  return -int4_scale(w, r, j) * static_cast<float>(int4_zero(w, r, j));
}

void dequantize_int4_row(const Int4Weights& w, int64_t r, float* dst) {
  const int64_t ng = int4_groups_per_row(w);
  for (int64_t j = 0; j < ng; ++j) {
    const float d = int4_scale(w, r, j);
    if (w.float_min()) {
      const float m = int4_offset(w, r, j);
      for (int64_t c = j * w.group; c < std::min(w.in, (j + 1) * w.group); ++c) dst[c] = d * static_cast<float>(int4_code(w, r, c)) + m;
      continue;
    }
    const int z = int4_zero(w, r, j);
    for (int64_t c = j * w.group; c < std::min(w.in, (j + 1) * w.group); ++c) dst[c] = d * static_cast<float>(int4_code(w, r, c) - z);
  }
}

void dequantize_int4(const Int4Weights& w, float* dst) {
  validate_int4(w);
  for (int64_t r = 0; r < w.out; ++r) dequantize_int4_row(w, r, dst + r * w.in);
}

double int4_bits_per_weight(int64_t in, int64_t group, bool asym, bool float_min, bool k_quant) {
  if (group <= 0 || in <= 0) throw std::invalid_argument("bits_per_weight: group size and width must be positive");
  const int64_t groups = (in + group - 1) / group;
  const double groups_per_weight = double(groups) / double(in);
  if (k_quant) return 4.0 + 8.0 * kQ4kHeadBytes * double(q4k_superblocks(groups)) / double(in);
  if (float_min) return 4.0 + 32.0 * groups_per_weight;
  return 4.0 + 16.0 * groups_per_weight + (asym ? 4.0 * groups_per_weight : 0.0);
}

double bits_per_weight(const Int4Weights& w) { return int4_bits_per_weight(w.in, w.group, w.asym, w.float_min(), w.k_quant()); }

int64_t int4_storage_bytes(const Int4Weights& w) {
  if (w.k_quant()) return static_cast<int64_t>(w.packed.size() + w.superblock_scales.size());
  return static_cast<int64_t>(w.packed.size() + 2 * w.scales_f16.size() + w.zeros_packed.size() + 2 * w.mins_f16.size());
}

}  // namespace sq
