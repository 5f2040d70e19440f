// The token embedding stored quantized, dequantized one row per looked-up token (as llama.cpp's
// get_rows on a Q8_0 / Q4_0 / Q4_K token_embd): INT8 rows with one step per row, or group-wise
// INT4 in the W4A16 layout (quant/int4_quantize.h). The codes may be borrowed from a mapped .sqm
// (ops/packed_storage.h): a lookup reads them in place.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ops/packed_storage.h"
#include "quant/int4_quantize.h"

namespace sq {

/// A [vocab, dim] token embedding held as INT8 rows or group-wise INT4 rows; empty until set.
class QuantizedEmbedding {
 public:
  /// INT8 rows: q [vocab, dim] row-major, scales [vocab]; row r is q[r, :] · scales[r].
  /// Throws std::invalid_argument on a size mismatch (the message gives the expected sizes).
  void set_int8(int64_t vocab, int64_t dim, ops::Int8Codes q, std::vector<float> scales);
  /// Group-wise INT4 rows: w.out = vocab rows of w.in = dim values (row r is dequantize_int4_row).
  /// Throws std::invalid_argument when w is not [vocab, dim] or fails validate_int4.
  void set_int4(int64_t vocab, int64_t dim, Int4Weights w);
  bool empty() const { return !int4_ && int8_.empty(); }
  /// "int8", "int4" or "" (empty).
  std::string format() const { return int4_ ? "int4" : int8_.empty() ? "" : "int8"; }
  /// Writes row `token` (< vocab, unchecked) dequantized to FP32 into dst[0, dim).
  void lookup(int32_t token, float* dst) const;

 private:
  int64_t dim_ = 0;
  ops::Int8Codes int8_;              ///< [vocab, dim] (INT8 form)
  std::vector<float> int8_scales_;   ///< [vocab] (INT8 form)
  std::optional<Int4Weights> int4_;  ///< the INT4 form
};

}  // namespace sq
