#include "quant/codebook_quantize.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

namespace sq {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

void validate_codebook(std::span<const float> codebook, int bits) {
  if (bits < 1 || bits > 8) throw std::invalid_argument("codebook: bits = " + std::to_string(bits) + " must be in [1, 8]");
  const size_t k = size_t(1) << bits;
  if (codebook.size() != k)
    throw std::invalid_argument("codebook: " + std::to_string(codebook.size()) + " signposts, expected 2^" + std::to_string(bits) +
                                " = " + std::to_string(k));
  for (size_t j = 0; j < k; ++j) {
    if (!std::isfinite(codebook[j]))
      throw std::invalid_argument("codebook: signpost " + std::to_string(j) + " = " + num(codebook[j]) + " is not finite");
    if (j > 0 && codebook[j] < codebook[j - 1])
      throw std::invalid_argument("codebook: signpost " + std::to_string(j) + " = " + num(codebook[j]) + " is below signpost " +
                                  std::to_string(j - 1) + " = " + num(codebook[j - 1]) + " (expected non-decreasing)");
  }
}

CodebookQuantizer::CodebookQuantizer(std::vector<float> codebook, int bits) : bits_(bits), codebook_(std::move(codebook)) {
  validate_codebook(codebook_, bits_);
  const size_t k = codebook_.size();
  // Distinct signposts (first index of each run of equal values) and their midpoints.
  first_of_.assign(k, 0);
  size_t distinct = 0;
  for (size_t j = 0; j < k; ++j)
    if (j == 0 || codebook_[j] != codebook_[j - 1]) first_of_[distinct++] = static_cast<uint8_t>(j);
  mids_.assign(k, std::numeric_limits<double>::infinity());
  for (size_t r = 0; r + 1 < distinct; ++r)
    mids_[r] = 0.5 * (double(codebook_[first_of_[r]]) + double(codebook_[first_of_[r + 1]]));
}

uint8_t CodebookQuantizer::encode_unchecked(float x) const {
  // Count of midpoints < x by branchless binary search over the 2^bits-entry padded array (the last
  // entry, +inf, is never < x, so the count is ≤ 2^bits − 1).
  const double xd = x;
  const double* m = mids_.data();
  size_t idx = 0;
  for (size_t step = mids_.size() >> 1; step > 0; step >>= 1) idx += (m[idx + step - 1] < xd) ? step : 0;
  return first_of_[idx];
}

uint8_t CodebookQuantizer::encode(float x) const {
  if (std::isnan(x)) throw std::invalid_argument("codebook encode: input is NaN");
  return encode_unchecked(x);
}

void CodebookQuantizer::encode(const float* x, int64_t n, uint8_t* codes) const {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) throw std::invalid_argument("codebook encode: x[" + std::to_string(i) + "] is NaN");
    codes[i] = encode_unchecked(x[i]);
  }
}

void CodebookQuantizer::decode(const uint8_t* codes, int64_t n, float* out) const {
  const size_t k = codebook_.size();
  for (int64_t i = 0; i < n; ++i) {
    if (codes[i] >= k)
      throw std::invalid_argument("codebook decode: codes[" + std::to_string(i) + "] = " + std::to_string(codes[i]) +
                                  " is not below 2^" + std::to_string(bits_) + " = " + std::to_string(k));
    out[i] = codebook_[codes[i]];
  }
}

}  // namespace sq
