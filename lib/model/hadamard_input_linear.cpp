#include "model/hadamard_input_linear.h"

#include <stdexcept>
#include <vector>

#include "model/w8a8_linear.h"
#include "ops/hadamard.h"

namespace sq {

HadamardInputLinear::HadamardInputLinear(std::unique_ptr<Linear> inner, int64_t block) : inner_(std::move(inner)), block_(block) {
  if (!inner_) throw std::invalid_argument("HadamardInputLinear: no inner linear");
  ops::check_hadamard_block(inner_->in_features(), block, "HadamardInputLinear");
}

const float* HadamardInputLinear::rotated_input(const float* x, int64_t n) const {
  const int64_t in = inner_->in_features();
  thread_local std::vector<float> rotated;
  if (rotated.size() < size_t(n * in)) rotated.resize(size_t(n * in));
  ops::hadamard_rows(x, rotated.data(), n, in, block_);
  return rotated.data();
}

void HadamardInputLinear::forward(const float* x, int64_t n, float* y) const {
  const auto* q = dynamic_cast<const W8A8Linear*>(inner_.get());
  if (q && q->quantizes_rows_independently()) {  // rotated while quantized, row by row
    thread_local W8A8Linear::QuantizedInput qx;
    q->quantize_input_u8(x, n, qx, block_);
    q->forward_prequantized(qx, y);
    return;
  }
  inner_->forward(rotated_input(x, n), n, y);
}

std::string HadamardInputLinear::format() const { return inner_->format() + "+hadamard" + std::to_string(block_); }

}  // namespace sq
