#include "ops/hadamard.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace sq::ops {

namespace {

bool power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

using V16 = float __attribute__((vector_size(64)));
/// The same vector at any float alignment: one 64-byte load or store. (std::memcpy into a V16 on
/// the stack became two 32-byte stores read back by one 64-byte load under GCC's 256-bit
/// preference: a store-forwarding stall that made the transform of SmolLM2's 576-wide rows (blocks
/// of 64) take 0.65 µs a row instead of about 0.1.)
using V16u = float __attribute__((vector_size(64), aligned(4)));

inline V16 load16(const float* p) { return *reinterpret_cast<const V16u*>(p); }
inline void store16(float* p, V16 v) { *reinterpret_cast<V16u*>(p) = v; }

/// The first four butterfly passes (distances 1, 2, 4, 8) inside one 16-float vector: pass h pairs
/// lane i with lane i ^ h and keeps a + c in the lane whose bit h is clear, a − c (= c' − x) in the
/// other, i.e. x ← swap_h(x) + sign_h ⊙ x with sign_h = −1 where bit h is set.
inline V16 fwht16(V16 x) {
  const V16 s1 = {1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1};
  const V16 s2 = {1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1};
  const V16 s4 = {1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1};
  const V16 s8 = {1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1};
  x = __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14) + s1 * x;
  x = __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13) + s2 * x;
  x = __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11) + s4 * x;
  x = __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7) + s8 * x;
  return x;
}

/// The butterfly passes (a, c) -> (a + c, a − c) at distances 1, 2, …, n/2 over v[0 .. n), n a
/// power of two: on floats (a block below 16) or on whole vectors (v[j] and v[j + h] 16·h floats
/// apart, the passes above fwht16's).
template <typename T>
void butterflies(T* v, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const T a = v[j], c = v[j + h];
        v[j] = a + c;
        v[j + h] = a - c;
      }
}

/// The first log2(16·N) passes of a chunk of 16·N floats held in N vectors: fwht16 in each, then
/// butterflies between whole vectors at distances 1, 2, …, N/2 vectors. `scale` multiplies the
/// result (1 when passes remain).
template <int N>
void fwht_chunk(float* x, float scale) {
  V16 r[N];
  for (int k = 0; k < N; ++k) {
    r[k] = fwht16(load16(x + 16 * k));
  }
  butterflies(r, N);
  for (int k = 0; k < N; ++k) store16(x + 16 * k, r[k] * scale);
}

/// Sylvester transform of x[0 .. b) in place (b a power of two) times `scale`: log2 b passes of
/// butterflies (a, c) -> (a + c, a − c) at distance h = 1, 2, 4, …. For b ≥ 16 the passes up to
/// distance 128 run on chunks of at most 256 floats in registers (fwht_chunk) and the rest on
/// whole vectors in memory. Each pass computes one rounded addition per element whatever the
/// path, so every path gives the same bits.
void fwht(float* x, int64_t b, float scale) {
  if (b < 16) {
    butterflies(x, b);
    for (int64_t j = 0; j < b; ++j) x[j] *= scale;
    return;
  }
  const int64_t chunk = b < 256 ? b : 256;
  const float chunk_scale = chunk == b ? scale : 1.0f;
  for (int64_t i = 0; i < b; i += chunk) {
    switch (chunk) {
      case 16: fwht_chunk<1>(x + i, chunk_scale); break;
      case 32: fwht_chunk<2>(x + i, chunk_scale); break;
      case 64: fwht_chunk<4>(x + i, chunk_scale); break;
      case 128: fwht_chunk<8>(x + i, chunk_scale); break;
      default: fwht_chunk<16>(x + i, chunk_scale); break;
    }
  }
  for (int64_t h = chunk; h < b; h *= 2) {
    const float s = 2 * h == b ? scale : 1.0f;  // the last pass scales
    for (int64_t i = 0; i < b; i += 2 * h)
      for (int64_t j = i; j < i + h; j += 16) {
        const V16 a = load16(x + j), c = load16(x + j + h);
        store16(x + j, (a + c) * s);
        store16(x + j + h, (a - c) * s);
      }
  }
}

}  // namespace

void check_hadamard_block(int64_t n, int64_t block, const char* what) {
  if (!power_of_two(block) || n % block != 0)
    throw std::invalid_argument(std::string(what) + ": Hadamard block " + std::to_string(block) +
                                " is not a power of two dividing " + std::to_string(n));
}

int64_t hadamard_block(int64_t n, int64_t max_block) {
  if (n <= 0) throw std::invalid_argument("hadamard_block: width " + std::to_string(n) + " is not positive");
  if (!power_of_two(max_block)) throw std::invalid_argument("hadamard_block: max_block " + std::to_string(max_block) + " is not a power of two");
  const int64_t b = n & -n;  // lowest set bit: the largest power of two dividing n
  return b < max_block ? b : max_block;
}

void hadamard_row(const float* x, float* y, int64_t n, int64_t block) {
  const float scale = float(1.0 / std::sqrt(double(block)));
  if (x != y) std::memcpy(y, x, size_t(n) * sizeof(float));
  for (int64_t k = 0; k < n; k += block) fwht(y + k, block, scale);
}

void hadamard_rows(const float* x, float* y, int64_t rows, int64_t n, int64_t block) {
  check_hadamard_block(n, block, "hadamard_rows");
  // Rows are independent and each is transformed the same way: the result does not depend on the
  // thread count. Each thread copies its own rows (while they are in its cache), then transforms them.
#pragma omp parallel for schedule(static) if (rows * n >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) hadamard_row(x + r * n, y + r * n, n, block);
}

void hadamard_rows(float* x, int64_t rows, int64_t n, int64_t block) { hadamard_rows(x, x, rows, n, block); }

void hadamard_rows(double* x, int64_t rows, int64_t n, int64_t block) {
  check_hadamard_block(n, block, "hadamard_rows");
  const double scale = 1.0 / std::sqrt(double(block));
#pragma omp parallel for schedule(static) if (rows * n >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < n; k += block) {
      double* v = x + r * n + k;
      butterflies(v, block);
      for (int64_t j = 0; j < block; ++j) v[j] *= scale;
    }
}

void hadamard_columns(float* x, int64_t rows, int64_t cols, int64_t block) {
  check_hadamard_block(rows, block, "hadamard_columns");
  std::vector<float> col(static_cast<size_t>(rows));
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) col[size_t(r)] = x[r * cols + c];
    hadamard_rows(col.data(), 1, rows, block);
    for (int64_t r = 0; r < rows; ++r) x[r * cols + c] = col[size_t(r)];
  }
}

}  // namespace sq::ops
