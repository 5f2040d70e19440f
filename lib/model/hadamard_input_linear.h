// A linear whose input is rotated online (QuaRot, Ashkboos et al. 2024, §3: the Hadamard before
// the down projection, "R4" in SpinQuant's naming): y = W'·(R·x) with W' = W·R stored, R the
// block-diagonal Walsh–Hadamard rotation of ops/hadamard.h. Rotating the input spreads the few
// huge channels of the FFN hidden activation over a block, so per-token INT8 steps (absmax/127 of
// the row) stop being set by one outlier. The converter folds R into the stored weight
// (calib/recipe_rotation.h); the wrapped linear is any format (W8A8 on INT8 GEMMs, FP32, …).
#pragma once

#include <memory>
#include <string>

#include "model/linear.h"

namespace sq {

class HadamardInputLinear final : public Linear {
 public:
  /// `inner`: the linear holding W·R (in_features n); `block`: R's block (a power of two dividing
  /// n, ops::hadamard_block). Throws std::invalid_argument when inner is null or block is invalid.
  HadamardInputLinear(std::unique_ptr<Linear> inner, int64_t block);

  int64_t in_features() const override { return inner_->in_features(); }
  int64_t out_features() const override { return inner_->out_features(); }
  /// x: [n, in] FP32 (not modified) → y: [n, out]: R·x into a per-thread buffer, then inner's
  /// forward; a per-token W8A8 inner linear quantizes R·x row by row as it rotates
  /// (W8A8Linear::quantize_input_u8 with the block), the same bits. Safe to call concurrently.
  void forward(const float* x, int64_t n, float* y) const override;
  /// inner's format + "+hadamard<block>", e.g. "w8a8-per-channel-per-token+hadamard512".
  std::string format() const override;
  int64_t weight_bytes() const override { return inner_->weight_bytes(); }

  /// R·x for x [n, in] FP32, in a buffer of the calling thread (valid until its next call on this
  /// thread, by any HadamardInputLinear): what forward passes to the inner linear. The decoder
  /// rotates an input shared by several such linears once with it.
  const float* rotated_input(const float* x, int64_t n) const;
  const Linear& inner() const { return *inner_; }
  int64_t block() const { return block_; }

 private:
  std::unique_ptr<Linear> inner_;
  int64_t block_;
};

}  // namespace sq
