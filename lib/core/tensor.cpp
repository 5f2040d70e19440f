#include "core/tensor.h"

#include <cstring>
#include <stdexcept>

namespace sq {

namespace {
int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
}  // namespace

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Tensor Tensor::zeros(std::vector<int64_t> shape) {
  return from_vector(shape, std::vector<float>(static_cast<size_t>(product(shape)), 0.0f));
}

Tensor Tensor::from_vector(std::vector<int64_t> shape, std::vector<float> values) {
  if (static_cast<int64_t>(values.size()) != product(shape))
    throw std::invalid_argument("Tensor::from_vector: " + std::to_string(values.size()) +
                                " values do not fill shape " + shape_to_string(shape));
  auto storage = std::make_shared<std::vector<float>>(std::move(values));
  Tensor t;
  t.shape_ = std::move(shape);
  t.data_ = storage->data();
  t.keepalive_ = storage;
  t.owned_ = true;
  return t;
}

Tensor Tensor::view(std::vector<int64_t> shape, const float* data, std::shared_ptr<const void> keepalive) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.data_ = data;
  t.keepalive_ = std::move(keepalive);
  t.owned_ = false;
  return t;
}

int64_t Tensor::dim(int i) const {
  const int r = rank();
  if (i < 0) i += r;
  if (i < 0 || i >= r) throw std::out_of_range("Tensor::dim: axis out of range for shape " + shape_string());
  return shape_[static_cast<size_t>(i)];
}

int64_t Tensor::numel() const { return data_ ? product(shape_) : 0; }

float* Tensor::mutable_data() {
  if (!owned_) throw std::logic_error("Tensor::mutable_data on a read-only view; clone() it first");
  return const_cast<float*>(data_);
}

Tensor Tensor::clone() const {
  std::vector<float> v(static_cast<size_t>(numel()));
  if (!v.empty()) std::memcpy(v.data(), data_, v.size() * sizeof(float));
  return from_vector(shape_, std::move(v));
}

std::string Tensor::shape_string() const { return shape_to_string(shape_); }

}  // namespace sq
