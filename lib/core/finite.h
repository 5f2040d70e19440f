// Finite checks for weights: one cheap, vectorizable pass over FP32 / FP16 / BF16 data that finds
// the first NaN or ±Inf (an all-ones exponent), and the load-time check of a whole checkpoint.
#pragma once

#include <cstdint>
#include <string>

#include "core/checkpoint.h"

namespace sq {

/// Index of the first element of x[0, n) that is NaN or ±Inf, or −1 when all are finite. Tests the
/// exponent bits in blocks (branch-free inside a block, so the compiler vectorizes it): about the
/// cost of reading the data once. `x` may be null when n == 0.
int64_t first_nonfinite_f32(const float* x, int64_t n);
/// The same for IEEE binary16 bit patterns (exponent 0x7C00 all ones: ±Inf or NaN).
int64_t first_nonfinite_f16(const uint16_t* x, int64_t n);
/// The same for bfloat16 bit patterns (exponent 0x7F80 all ones: ±Inf or NaN).
int64_t first_nonfinite_bf16(const uint16_t* x, int64_t n);

/// "nan", "inf" or "-inf" (for messages about a value known to be non-finite; "finite" otherwise).
std::string nonfinite_name(float v);
/// "index 7 (element [0, 7] of shape [64, 64])": a flat index and its coordinates in `shape`
/// (just "index 7" for a rank-0/1 shape).
std::string element_position(int64_t index, const std::vector<int64_t>& shape);

/// Throws NonFiniteError "SOURCE: tensor 'NAME' holds a non-finite value (nan) at index 7 (element
/// [0, 7] of shape [64, 64])" when a tensor of `checkpoint` has a NaN or ±Inf; a single pass over
/// every tensor (checkpoint tensors are FP32: F16/BF16 files were widened, which keeps Inf and NaN).
void check_checkpoint_finite(const Checkpoint& checkpoint);

}  // namespace sq
