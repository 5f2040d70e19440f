// A minimal dense FP32 tensor: row-major data plus a shape.
//
// A Tensor either owns its values (created with `Tensor::zeros` / `Tensor::from_vector`, e.g. after
// widening BF16 to FP32) or views memory owned by someone else (e.g. a memory-mapped checkpoint),
// kept alive through `keepalive`. Copies are shallow (they share storage); use `clone()` for a deep,
// owned, writable copy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sq {

class Tensor {
 public:
  Tensor() = default;

  /// Owned tensor of the given shape, filled with zeros.
  static Tensor zeros(std::vector<int64_t> shape);
  /// Owned tensor taking `values` (values.size() must equal the product of `shape`, else throws
  /// std::invalid_argument).
  static Tensor from_vector(std::vector<int64_t> shape, std::vector<float> values);
  /// Non-owning view of `data` (row-major, product(shape) floats); `keepalive` keeps the
  /// underlying storage (e.g. a MappedFile) alive as long as any copy of this Tensor exists.
  static Tensor view(std::vector<int64_t> shape, const float* data, std::shared_ptr<const void> keepalive);

  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  /// Size of dimension `i`; negative `i` counts from the end. Throws std::out_of_range.
  int64_t dim(int i) const;
  int64_t numel() const;
  bool empty() const { return data_ == nullptr; }

  const float* data() const { return data_; }
  /// Writable data; only for owned tensors (throws std::logic_error on a view).
  float* mutable_data();
  bool owned() const { return owned_; }

  /// Deep copy into owned, writable storage.
  Tensor clone() const;
  /// "[64, 512]" style shape string for messages.
  std::string shape_string() const;

 private:
  std::vector<int64_t> shape_;
  const float* data_ = nullptr;
  std::shared_ptr<const void> keepalive_;
  bool owned_ = false;
};

/// "[a, b, c]" for any shape vector (used in error messages).
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace sq
