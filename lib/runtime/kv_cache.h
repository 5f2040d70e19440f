// FP32 key/value cache of a decoder.
#pragma once

#include <cstdint>
#include <vector>

#include "core/model_config.h"

namespace sq {

/// Keys and values of every layer for up to `capacity` positions.
/// Layout per layer: K and V are [capacity, n_kv_heads * head_dim] row-major, row p = position p.
/// Keys are stored after RoPE. `length` is the number of filled positions (same for all layers).
class KVCache {
 public:
  KVCache(const ModelConfig& config, int64_t capacity);
  int64_t capacity() const { return capacity_; }
  int64_t length() const { return length_; }
  int64_t kv_width() const { return kv_width_; }
  /// Forget all positions (the storage is kept).
  void clear() { length_ = 0; }
  /// Mark `n` more positions as filled (after every layer has written them).
  void advance(int64_t n) { length_ += n; }

  float* keys(int layer) { return k_.data() + layer * capacity_ * kv_width_; }
  float* values(int layer) { return v_.data() + layer * capacity_ * kv_width_; }

 private:
  int64_t capacity_;
  int64_t kv_width_;
  int64_t length_ = 0;
  std::vector<float> k_, v_;
};

}  // namespace sq
