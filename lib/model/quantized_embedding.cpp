#include "model/quantized_embedding.h"

#include <stdexcept>

namespace sq {

void QuantizedEmbedding::set_int8(int64_t vocab, int64_t dim, ops::Int8Codes q, std::vector<float> scales) {
  if (vocab <= 0 || dim <= 0 || q.size() != size_t(vocab * dim) || scales.size() != size_t(vocab))
    throw std::invalid_argument("quantized embedding: expected " + std::to_string(vocab) + " x " + std::to_string(dim) + " INT8 values and " +
                                std::to_string(vocab) + " scales, got " + std::to_string(q.size()) + " and " + std::to_string(scales.size()));
  dim_ = dim;
  int8_ = std::move(q);
  int8_scales_ = std::move(scales);
  int4_.reset();
}

void QuantizedEmbedding::set_int4(int64_t vocab, int64_t dim, Int4Weights w) {
  if (w.out != vocab || w.in != dim)
    throw std::invalid_argument("quantized embedding: expected " + std::to_string(vocab) + " x " + std::to_string(dim) + " INT4 weights, got " +
                                std::to_string(w.out) + " x " + std::to_string(w.in));
  validate_int4(w);
  dim_ = dim;
  int4_ = std::move(w);
  int8_ = ops::Int8Codes();
  int8_scales_.clear();
}

void QuantizedEmbedding::lookup(int32_t token, float* dst) const {
  if (int4_) return dequantize_int4_row(*int4_, token, dst);
  const int8_t* row = int8_.data() + int64_t(token) * dim_;
  const float scale = int8_scales_[static_cast<size_t>(token)];
  for (int64_t j = 0; j < dim_; ++j) dst[j] = static_cast<float>(row[j]) * scale;
}

}  // namespace sq
