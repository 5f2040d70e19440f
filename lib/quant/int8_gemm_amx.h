// The AMX-INT8 micro-kernel of the INT8 GEMM (Int8Backend::Amx of quant/int8_gemm.h).
//
// Intel AMX (Advanced Matrix Extensions; Intel 64 and IA-32 Architectures Software Developer's
// Manual, vol. 1 ch. 18, and the instruction set reference for TDPBUSD): eight tile registers of up
// to 16 rows × 64 bytes, and TDPBUSD, which for tiles C[M][N] (int32), A[M][64] (u8) and B[16][N·4]
// (s8) computes
//
//   C[i][j] += Σ_{q<16} Σ_{t<4} u8(A[i][4q + t]) · s8(B[q][4j + t])
//
// i.e. one 16 × 16 × 64 block of a u8 × s8 product (16,384 multiply-adds) per instruction. B's tile
// row q holds 4 consecutive k values of each of 16 columns: the VNNI backend's packed panel layout
// ([k/4][w][4] bytes, quant/int8_gemm.cpp), here with panels of w = 32 columns read with a row
// stride of 32 · 4 bytes (k/4 padded to a multiple of 16 with zero weights, whose products vanish
// whatever the activation bytes there are). Activations are the biased u8 rows (a + 128) of
// quantize_activations_u8, the shift undone by the same −128 · Σ_k B[j, k] compensation.
//
// Blocking: one panel's 32 rows × 32 columns per call — tiles 0–3 accumulate C (2 × 2 blocks of
// 16 × 16), tiles 4–5 hold two 16-row slices of A, tiles 6–7 two 16-column slices of B, so each
// pair of A loads and pair of B loads feeds four TDPBUSD. (The VNNI kernel's 48-column panels would
// need a 2 × 1 pass per panel besides, which reloads A for two products.) 16-row and 16-column
// tails take 1 × 2, 2 × 1 or 1 × 1 blocks; the last m mod 16 rows are left to the VNNI kernel on
// the same panels (a tile always reads 16 rows). The INT32 tiles go through the VNNI backend's
// epilogue (quant/int8_gemm_epilogue.h), so all backends stay bit-identical.
//
// Availability: the build must target AMX-TILE and AMX-INT8 (SQ_NATIVE on such a CPU), the CPU must
// report them (CPUID.(EAX=7,ECX=0):EDX bits 24 and 25), and Linux must grant the process the tile
// data state (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), kernel 5.16+), requested once.
// Each thread loads the tile configuration before its first tile instruction (TileScope).
#pragma once

#include <cstdint>

#include "quant/int8_gemm.h"

namespace sq::int8_amx {

/// Whether AMX-INT8 can run here: the build, the CPU and the operating system (file comment).
/// The first call requests the tile data permission for the process; later calls return the cached
/// answer. Never throws.
bool available();

/// Tile shapes of a TileScope.
enum class TileShapes {
  Deep64,    ///< tiles 0–7 all 16 rows × 64 bytes: 64-deep products (block)
  Groups32,  ///< C tiles 0–3 16 × 64 bytes, A tiles 4–5 16 rows × 32 bytes, B tiles 6–7 8 rows × 64 bytes:
             ///< 32-deep products, one per activation group (block_grouped)
};

/// The calling thread's tile configuration (palette 1, `shapes`) for the object's lifetime: loaded
/// by the constructor, released (TILERELEASE) by the destructor. Construct only when available().
/// Not copyable.
class TileScope {
 public:
  explicit TileScope(TileShapes shapes = TileShapes::Deep64);
  ~TileScope();
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

/// One block of rows × (16 · ngroups) outputs, rows ∈ {16, 32}, ngroups ∈ {1, 2}, inside a
/// TileScope:
///   a:     biased u8 activations of the block's first row, row stride lda bytes; every row must
///          hold 64 · kchunks readable bytes (lda ≥ padded k);
///   b:     the block's first 16-column group in a packed panel, k-quad stride ldb bytes (panel
///          width · 4); 16 · kchunks quads readable;
///   comp:  [16 · ngroups] u8-shift compensation of the block's columns;
///   out:   y (kF32, dequantized with dq) or C (int32), row stride ldo, block origin (i0, j0);
///          the last group is stored under last_mask.
template <bool kF32>
void block(const uint8_t* a, int64_t lda, int rows, const int8_t* b, int64_t ldb, int64_t kchunks, int ngroups, const int32_t* comp,
           uint16_t last_mask, void* out, int64_t ldo, int64_t i0, int64_t j0, const Int8Dequant& dq);

/// The per-token-group product (quant/int8_gemm_grouped.h) of one block of rows × (16 · ngroups)
/// outputs, rows ∈ {16, 32}, ngroups ∈ {1, 2}, inside a TileScope(TileShapes::Groups32): for each
/// activation group g of 32 inputs, TDPBUSD over that group alone (16 × 16 × 32 per tile), its INT32
/// sums stored, compensated (gcomp + g·ldcomp: the block's [16 · ngroups] terms of group g) and
/// added in FP32 with the step sa[r·G + g] (sa: the block's first row); then the weight step and
/// bias of dq, stored to y (row stride ldo, origin (i0, j0), the last 16 columns under last_mask).
/// a, lda, b, ldb as for `block`; every row of a must hold 32·G readable bytes, b 8·G quads.
/// Bit-identical to the scalar definition.
void block_grouped(const uint8_t* a, int64_t lda, int rows, const int8_t* b, int64_t ldb, int64_t G, int ngroups, const int32_t* gcomp,
                   int64_t ldcomp, const float* sa, uint16_t last_mask, float* y, int64_t ldo, int64_t i0, int64_t j0,
                   const Int8Dequant& dq);

}  // namespace sq::int8_amx
