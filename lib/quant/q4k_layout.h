// GGML's Q4_K layout (ggml-common.h `block_q4_K`, QK_K = 256; also gguf-py's `quants.py`):
// two-level scales for 4-bit asymmetric weights. A row is cut into super-blocks of 256 columns,
// each into 8 groups ("sub-blocks") of 32. A super-block stores
//
//   offset  bytes  field
//        0      2  d      FP16, the scales' scale
//        2      2  dmin   FP16, the minimums' scale
//        4     12  scales the 8 pairs (sc_j, mi_j) of 6-bit integers, packed:
//                    j < 4:  sc_j = s[j] & 63,                          mi_j = s[j + 4] & 63
//                    j ≥ 4:  sc_j = (s[j + 4] & 15) | (s[j − 4] >> 6) << 4,
//                            mi_j = (s[j + 4] >> 4) | (s[j] >> 6) << 4
//       16    128  qs     the codes u ∈ [0, 15]: byte 32c + l holds column 64c + l of the
//                         super-block in its low nibble and column 64c + 32 + l in its high nibble
//
// and the weights are w = d · sc_j · u − dmin · mi_j (group j; 144 bytes for 256 weights, 4.5 bits).
// sqkit keeps the 16-byte head of each super-block as Int4Weights::superblock_scales (its codes stay
// in the row-major nibble layout of quant/int4_quantize.h); the last super-block of a row is shorter
// when 256 ∤ in (its unused (sc, mi) pairs are 0), which GGUF cannot store: such rows export as
// Q4_1 (formats/gguf_export.cpp), exactly, since Δ_j and m_j are FP16 values.
#pragma once

#include <cstdint>

#include "quant/int4_quantize.h"

namespace sq {

/// Bytes of a Q4_K super-block head (d, dmin, packed scales) and of a whole GGML block.
inline constexpr int64_t kQ4kHeadBytes = 16;
inline constexpr int64_t kQ4kBlockBytes = 144;
/// Groups of 32 per super-block, and its columns.
inline constexpr int64_t kQ4kGroups = 8;
inline constexpr int64_t kQ4kColumns = 256;

/// Super-blocks per row of K-quant weights with `groups` groups of 32 per row: ⌈groups / 8⌉.
inline int64_t q4k_superblocks(int64_t groups) { return (groups + kQ4kGroups - 1) / kQ4kGroups; }

/// Packs the 8 pairs of 6-bit integers (each < 64; std::invalid_argument otherwise) into GGML's
/// 12 bytes (file comment). The GGUF reader's k_quant_unpack_scale_min (formats/gguf_dequantize.h) unpacks
/// them.
void pack_q4k_scales(const uint8_t sc[8], const uint8_t mi[8], uint8_t out[12]);

/// Fills w.scales_f16 and w.mins_f16 ([out, ⌈in/32⌉] each) from w.superblock_scales: Δ_j = d · sc_j,
/// m_j = −dmin · mi_j. Requires g = 32, asym, and superblock_scales of [out, ⌈⌈in/32⌉/8⌉, 16]
/// bytes. Throws std::invalid_argument (naming the row) when a product is not an exact FP16 value
/// (the kernels hold FP16 scales; quantize_q4k's d and dmin always give exact ones) or d, dmin are
/// not finite.
void expand_q4k_scales(Int4Weights& w);

/// One GGML block_q4_K (file comment) from a super-block's 16-byte head and its 256 codes in sqkit's
/// row-major nibble layout (128 bytes, low nibble = even column; quant/int4_quantize.h).
void q4k_gguf_block(const uint8_t head[kQ4kHeadBytes], const uint8_t codes[kQ4kColumns / 2], uint8_t out[kQ4kBlockBytes]);

}  // namespace sq
