#include "formats/gguf_dequantize.h"

#include <cstring>
#include <stdexcept>

#include "core/error.h"
#include "formats/safetensors.h"  // half_to_float, bf16_to_float

namespace sq {

namespace {

constexpr int kQK = 32;    // elements per block of Q4_0 .. Q8_0
constexpr int kQKK = 256;  // elements per K-quant super-block

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

// The per-block routines below follow the layouts in the header; each inner loop runs over 16 or
// 32 elements with block-constant scales so that the compiler can vectorize it.

void q8_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int i = 0; i < kQK; ++i) y[i] = static_cast<float>(qs[i]) * d;
}

void q4_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const uint8_t* qs = b + 2;
  for (int i = 0; i < 16; ++i) {
    y[i] = d * static_cast<float>((qs[i] & 15) - 8);
    y[i + 16] = d * static_cast<float>((qs[i] >> 4) - 8);
  }
}

void q4_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int i = 0; i < 16; ++i) {
    y[i] = d * static_cast<float>(qs[i] & 15) + m;
    y[i + 16] = d * static_cast<float>(qs[i] >> 4) + m;
  }
}

void q5_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int i = 0; i < 16; ++i) {
    const int lo = (qs[i] & 15) | static_cast<int>(((qh >> i) & 1u) << 4);
    const int hi = (qs[i] >> 4) | static_cast<int>(((qh >> (i + 16)) & 1u) << 4);
    y[i] = d * static_cast<float>(lo - 16);
    y[i + 16] = d * static_cast<float>(hi - 16);
  }
}

void q5_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int i = 0; i < 16; ++i) {
    const int lo = (qs[i] & 15) | static_cast<int>(((qh >> i) & 1u) << 4);
    const int hi = (qs[i] >> 4) | static_cast<int>(((qh >> (i + 16)) & 1u) << 4);
    y[i] = d * static_cast<float>(lo) + m;
    y[i + 16] = d * static_cast<float>(hi) + m;
  }
}

void q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j)
      for (int half = 0; half < 2; ++half) {
        const int e0 = h * 128 + j * 32 + half * 16;  // first element of this 16-element group
        const uint8_t sc = scales[e0 / 16];
        const float dl = d * static_cast<float>(sc & 15), ml = dmin * static_cast<float>(sc >> 4);
        const uint8_t* q = qs + h * 32 + half * 16;
        for (int l = 0; l < 16; ++l) y[e0 + l] = dl * static_cast<float>((q[l] >> (2 * j)) & 3) - ml;
      }
}

void q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = f16_at(b + 108);
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j)
      for (int half = 0; half < 2; ++half) {
        const int e0 = h * 128 + j * 32 + half * 16;
        const int k = e0 / 16;
        const int lo = k < 8 ? (sc[k] & 15) : (sc[k - 8] >> 4);
        const int hi = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
        const float dl = d * static_cast<float>((lo | (hi << 4)) - 32);
        const uint8_t* q = qs + h * 32 + half * 16;
        const uint8_t* hm = hmask + half * 16;
        const int bit = 4 * h + j;
        for (int l = 0; l < 16; ++l) {
          const int v = ((q[l] >> (2 * j)) & 3) - (((hm[l] >> bit) & 1) ? 0 : 4);
          y[e0 + l] = dl * static_cast<float>(v);
        }
      }
}

}  // namespace

void k_quant_unpack_scale_min(const uint8_t* q, int s, int& sc, int& m) {
  if (s < 4) {
    sc = q[s] & 63;
    m = q[s + 4] & 63;
  } else {
    sc = (q[s + 4] & 15) | ((q[s - 4] >> 6) << 4);
    m = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
  }
}

namespace {

/// The shared part of Q4_K and Q5_K (their block layouts above): 8 sub-blocks of 32 with 6-bit
/// scales/mins from `scales`, low 4 bits from `qs` (chunk c holds sub-blocks 2c in its low nibbles
/// and 2c+1 in its high nibbles); Q5_K (kHighBit) adds bit 4 from qh[l], bit 2c / 2c+1.
template <bool kHighBit>
void k_quant_scale_min(const uint8_t* b, const uint8_t* scales, const uint8_t* qh, const uint8_t* qs, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  for (int c = 0; c < 4; ++c) {
    int sc0, m0, sc1, m1;
    k_quant_unpack_scale_min(scales, 2 * c, sc0, m0);
    k_quant_unpack_scale_min(scales, 2 * c + 1, sc1, m1);
    const float d0 = d * static_cast<float>(sc0), dm0 = dmin * static_cast<float>(m0);
    const float d1 = d * static_cast<float>(sc1), dm1 = dmin * static_cast<float>(m1);
    const uint8_t* q = qs + 32 * c;
    float* yc = y + 64 * c;
    const int b0 = 2 * c, b1 = 2 * c + 1;
    for (int l = 0; l < 32; ++l)
      yc[l] = d0 * static_cast<float>((q[l] & 15) | (kHighBit ? ((qh[l] >> b0) & 1) << 4 : 0)) - dm0;
    for (int l = 0; l < 32; ++l)
      yc[32 + l] = d1 * static_cast<float>((q[l] >> 4) | (kHighBit ? ((qh[l] >> b1) & 1) << 4 : 0)) - dm1;
  }
}

void q4_k(const uint8_t* b, float* y) { k_quant_scale_min<false>(b, b + 4, nullptr, b + 16, y); }

void q5_k(const uint8_t* b, float* y) { k_quant_scale_min<true>(b, b + 4, b + 16, b + 48, y); }

void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j) {
      const uint8_t* lo = ql + 64 * h + 32 * (j & 1);
      const int shift = 4 * (j >> 1);
      const uint8_t* hi = qh + 32 * h;
      for (int half = 0; half < 2; ++half) {
        const int e0 = h * 128 + j * 32 + half * 16;
        const float dl = d * static_cast<float>(scales[e0 / 16]);
        for (int l = half * 16; l < half * 16 + 16; ++l) {
          const int q = (((lo[l] >> shift) & 15) | (((hi[l] >> (2 * j)) & 3) << 4)) - 32;
          y[h * 128 + j * 32 + l] = dl * static_cast<float>(q);
        }
      }
    }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0: return q8_0;
    case GgmlType::Q4_0: return q4_0;
    case GgmlType::Q4_1: return q4_1;
    case GgmlType::Q5_0: return q5_0;
    case GgmlType::Q5_1: return q5_1;
    case GgmlType::Q2_K: return q2_k;
    case GgmlType::Q3_K: return q3_k;
    case GgmlType::Q4_K: return q4_k;
    case GgmlType::Q5_K: return q5_k;
    case GgmlType::Q6_K: return q6_k;
    default: return nullptr;
  }
}

}  // namespace

bool ggml_can_dequantize(GgmlType type) {
  return type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16 || block_fn(type) != nullptr;
}

void dequantize_row(GgmlType type, const uint8_t* src, float* dst, int64_t n) {
  const uint32_t id = static_cast<uint32_t>(type);
  const GgmlTypeTraits* tr = ggml_type_traits(id);
  if (!tr || !ggml_can_dequantize(type))
    throw UnsupportedError("dequantization of ggml type " + ggml_type_name(id) +
                           " is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, "
                           "Q4_K, Q5_K, Q6_K)");
  if (n < 0 || n % tr->block_size != 0)
    throw std::invalid_argument("dequantize_row: " + std::to_string(n) + " elements is not a whole number of " +
                                tr->name + " blocks");
  switch (type) {
    case GgmlType::F32:
      if (n) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_at(src + 2 * i);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_float(h);
      }
      return;
    default:
      break;
  }
  const BlockFn fn = block_fn(type);
  const int64_t blocks = n / tr->block_size;
  for (int64_t k = 0; k < blocks; ++k) fn(src + k * tr->type_size, dst + k * tr->block_size);
}

void dequantize_tensor_rows(const GgufFile& file, const GgufTensorInfo& info, int64_t row_begin, int64_t row_end,
                            float* dst) {
  if (!ggml_can_dequantize(info.type))
    throw UnsupportedError(file.path() + ": tensor '" + info.name + "' has ggml type " +
                           ggml_type_name(static_cast<uint32_t>(info.type)) +
                           ", which cannot be dequantized (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
                           "Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)");
  if (row_begin < 0 || row_begin > row_end || row_end > info.rows())
    throw std::out_of_range("dequantize_tensor_rows: rows [" + std::to_string(row_begin) + ", " +
                            std::to_string(row_end) + ") of tensor '" + info.name + "' with " +
                            std::to_string(info.rows()) + " rows");
  if (row_begin == row_end) return;
  const GgmlTypeTraits* tr = ggml_type_traits(static_cast<uint32_t>(info.type));
  // The reader checked nbytes = rows * row_length / block_size * type_size against the file.
  const int64_t row_bytes = info.row_length() / tr->block_size * tr->type_size;
  const uint8_t* src = file.tensor_data(info) + row_begin * row_bytes;
  dequantize_row(info.type, src, dst, (row_end - row_begin) * info.row_length());
}

Tensor dequantize_tensor(const GgufFile& file, const std::string& name) {
  const GgufTensorInfo& info = file.tensor(name);
  if (!ggml_can_dequantize(info.type)) dequantize_tensor_rows(file, info, 0, 0, nullptr);  // throws
  std::vector<float> values(static_cast<size_t>(info.numel));
  dequantize_tensor_rows(file, info, 0, info.rows(), values.data());
  return Tensor::from_vector(info.shape(), std::move(values));
}

}  // namespace sq
