#include "model/hadamard_input_linear.h"

#include <cstring>
#include <stdexcept>
#include <vector>

#include "ops/hadamard.h"

namespace sq {

HadamardInputLinear::HadamardInputLinear(std::unique_ptr<Linear> inner, int64_t block) : inner_(std::move(inner)), block_(block) {
  if (!inner_) throw std::invalid_argument("HadamardInputLinear: no inner linear");
  const int64_t n = inner_->in_features();
  if (block <= 0 || (block & (block - 1)) != 0 || n % block != 0)
    throw std::invalid_argument("HadamardInputLinear: block " + std::to_string(block) + " is not a power of two dividing the input width " +
                                std::to_string(n));
}

void HadamardInputLinear::forward(const float* x, int64_t n, float* y) const {
  const int64_t in = inner_->in_features();
  thread_local std::vector<float> rotated;
  if (rotated.size() < size_t(n * in)) rotated.resize(size_t(n * in));
  ops::hadamard_rows(x, rotated.data(), n, in, block_);
  inner_->forward(rotated.data(), n, y);
}

std::string HadamardInputLinear::format() const { return inner_->format() + "+hadamard" + std::to_string(block_); }

}  // namespace sq
