// FP32 dequantization of ggml tensor types (the tensors of GGUF files, formats/gguf_file.h).
//
// Source: ggml's block layouts (ggml/src/ggml-common.h) and reference dequantization
// (dequantize_row_* in ggml/src/ggml-quants.c); the `gguf` Python package's gguf.quants
// (GGUF 0.19.0) computes the same values and is the test oracle (tests/data/gguf_reference_*.json).
// Every multi-byte field is little-endian; "f16" is IEEE binary16. Within a tensor, blocks follow
// each other along a row (dims[0]) and rows follow each other; element i of a block is element
// block_start + i of the row. Products are evaluated in the order written below, in FP32, without
// fused multiply-add (the build uses -std=c++20, so GCC does not contract), which is also the
// order gguf.quants evaluates them in: both give bit-identical results.
//
//   type   elems bytes  block fields, in file order            element i (q = the quant)
//   F32        1     4  f32                                     x
//   F16        1     2  f16                                     exact widening
//   BF16       1     2  bf16 (high half of an f32)              exact widening
//   Q8_0      32    34  f16 d, i8 qs[32]                         qs[i] * d
//   Q4_0      32    18  f16 d, u8 qs[16]                         d * (q - 8); q = i < 16 ? qs[i] & 15 : qs[i-16] >> 4
//   Q4_1      32    20  f16 d, f16 m, u8 qs[16]                  d * q + m; q as Q4_0
//   Q5_0      32    22  f16 d, u8 qh[4], u8 qs[16]               d * (q - 16); q = nibble as Q4_0 | bit i of u32 qh << 4
//   Q5_1      32    24  f16 d, f16 m, u8 qh[4], u8 qs[16]        d * q + m; q as Q5_0
// K-quants: super-blocks of 256 elements made of 16-element (Q2_K, Q3_K, Q6_K) or 32-element
// (Q4_K, Q5_K) sub-blocks, each with its own scale (and min). Element i: h = i / 128, r = i % 128,
// j = r / 32, l = r % 32 (Q2_K, Q3_K, Q6_K); c = i / 64, s = i / 32 (sub-block), l = i % 32 (Q4_K, Q5_K).
//   Q2_K     256    84  u8 scales[16], u8 qs[64], f16 d, f16 dmin
//                       q = (qs[32h + l] >> 2j) & 3; sc = scales[i / 16];
//                       (d * (sc & 15)) * q - dmin * (sc >> 4)
//   Q3_K     256   110  u8 hmask[32], u8 qs[64], u8 scales[12], f16 d
//                       q = ((qs[32h + l] >> 2j) & 3) - (bit 4h + j of hmask[l] ? 0 : 4);
//                       (d * (S[i / 16] - 32)) * q, with the 16 6-bit scales S[k] packed as
//                       low 4 bits: k < 8 ? scales[k] & 15 : scales[k - 8] >> 4,
//                       high 2 bits: (scales[8 + k % 4] >> 2 * (k / 4)) & 3
//   Q4_K     256   144  f16 d, f16 dmin, u8 scales[12], u8 qs[128]
//                       q = l-th byte of qs[32c ..] : low nibble for even s, high for odd s;
//                       (d * SC[s]) * q - dmin * M[s], with the 8 6-bit scales SC and mins M:
//                       s < 4: SC = scales[s] & 63, M = scales[s + 4] & 63;
//                       s >= 4: SC = (scales[s + 4] & 15) | (scales[s - 4] >> 6) << 4,
//                               M = (scales[s + 4] >> 4) | (scales[s] >> 6) << 4
//   Q5_K     256   176  f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]
//                       q = Q4_K nibble + 16 * (bit s of qh[l]); (d * SC[s]) * q - dmin * M[s]
//   Q6_K     256   210  u8 ql[128], u8 qh[64], i8 scales[16], f16 d
//                       q = (nibble 4 * (j >> 1) of ql[64h + 32 * (j & 1) + l]
//                            | ((qh[32h + l] >> 2j) & 3) << 4) - 32;  (d * scales[i / 16]) * q
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "formats/ggml_types.h"
#include "formats/gguf_file.h"

namespace sq {

/// The 6-bit scale sc and minimum m of sub-block s ∈ [0, 8) of a Q4_K / Q5_K super-block, from its
/// 12 packed bytes `scales` (ggml-common.h `block_q4_K.scales`; layout in quant/q4k_layout.h:
/// s < 4: sc = q[s] & 63, m = q[s+4] & 63; s ≥ 4: the nibbles of q[s+4] plus the top two bits of
/// q[s−4] / q[s]). No bounds check beyond s's range being the caller's.
void k_quant_unpack_scale_min(const uint8_t* scales, int s, int& sc, int& m);

/// True for the types dequantize_row supports: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
/// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
bool ggml_can_dequantize(GgmlType type);

/// Dequantizes `n` consecutive elements of type `type` stored at `src` (n / block_size blocks,
/// n / block_size * type_size bytes, see the table above) into `dst` (n floats). `n` must be a
/// multiple of the type's block size (std::invalid_argument otherwise); `src` needs no alignment.
/// Throws UnsupportedError naming the type for a type outside ggml_can_dequantize.
void dequantize_row(GgmlType type, const uint8_t* src, float* dst, int64_t n);

/// Dequantizes rows [row_begin, row_end) of tensor `info` of `file` into `dst`, which receives
/// (row_end - row_begin) * info.row_length() floats, row-major (a row is dims[0] elements). One
/// tensor (or a slice of one) at a time: the caller owns the only FP32 copy. Throws
/// UnsupportedError naming the file, the tensor and the type for an unsupported type, and
/// std::out_of_range when 0 <= row_begin <= row_end <= info.rows() does not hold.
void dequantize_tensor_rows(const GgufFile& file, const GgufTensorInfo& info, int64_t row_begin, int64_t row_end,
                            float* dst);

/// The whole tensor `name` as an owned FP32 Tensor of row-major shape info.shape() (dims
/// reversed). Throws InputError when absent, UnsupportedError like dequantize_tensor_rows.
Tensor dequantize_tensor(const GgufFile& file, const std::string& name);

}  // namespace sq
