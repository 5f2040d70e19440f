// Non-uniform (codebook) quantization of FP32 values: KVQuant's nuqX datatype (Hooper et al. 2024,
// §3.3): a sorted codebook of 2^b signposts c_0 ≤ … ≤ c_{2^b−1} (fitted offline by
// calib/weighted_kmeans.h, fit_nuq_codebook); a value is stored as the b-bit index of its nearest
// signpost and decoded by table lookup. Normalization to the codebook's range (KVQuant's per-channel
// Key / per-token Value scaling and outlier removal) is the caller's business.
//
// Encoding rule: code(x) = argmin_j |x − c_j|, TIES TO THE LOWER INDEX: x exactly on the midpoint of
// two signposts gets the smaller one, and among equal (duplicated) signposts the first index is
// returned, so a duplicate is never emitted. Implemented as a branchless binary search over the
// midpoints m_j = (c_j + c_{j+1}) / 2 of the distinct signposts, computed in double (exact for FP32
// signposts whose magnitudes are within 2^29 of each other; otherwise within one double rounding):
// code = first index of the (#midpoints < x)-th distinct signpost. x = ±inf maps to the last / first
// signpost; NaN throws. Decode: c[code].
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace sq {

/// Throws std::invalid_argument unless bits ∈ [1, 8], codebook.size() == 2^bits, every signpost is
/// finite and the signposts are sorted non-decreasing (the message names the index at fault).
void validate_codebook(std::span<const float> codebook, int bits);

/// A validated nuqX codebook with its encoder (file comment) and decoder.
class CodebookQuantizer {
 public:
  /// `codebook` [2^bits] FP32 signposts, non-decreasing, finite; throws as validate_codebook.
  CodebookQuantizer(std::vector<float> codebook, int bits);

  int bits() const { return bits_; }
  const std::vector<float>& codebook() const { return codebook_; }
  /// The encoder's tables, for kernels that reproduce `encode` elsewhere (the CUDA KV encoder):
  /// midpoints [2^bits] between consecutive distinct signposts (+inf padded) and first_of [2^bits],
  /// distinct-signpost rank → first codebook index of that value.
  const std::vector<double>& midpoints() const { return mids_; }
  const std::vector<uint8_t>& first_of() const { return first_of_; }

  /// Index of the nearest signpost of x (ties to the lower index). Throws std::invalid_argument for NaN.
  uint8_t encode(float x) const;
  /// codes[i] = encode(x[i]) for i < n (x [n] FP32, codes [n] one code per byte; see
  /// quant/packed_bits.h to pack them). Throws std::invalid_argument naming the first NaN's index.
  void encode(const float* x, int64_t n, uint8_t* codes) const;
  /// out[i] = codebook[codes[i]] for i < n. Throws std::invalid_argument for a code ≥ 2^bits.
  void decode(const uint8_t* codes, int64_t n, float* out) const;

 private:
  uint8_t encode_unchecked(float x) const;
  int bits_;
  std::vector<float> codebook_;
  std::vector<double> mids_;      ///< [2^bits] midpoints of the distinct signposts, padded with +inf
  std::vector<uint8_t> first_of_; ///< [2^bits] distinct-signpost rank → first codebook index
};

}  // namespace sq
