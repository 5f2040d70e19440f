#include "model/linear.h"

#include "ops/sgemm.h"

#include <mutex>
#include <stdexcept>

namespace sq {

struct DenseLinear::Packed {
  std::mutex mu;
  bool tried = false;
  std::unique_ptr<ops::WeightMatmul> mm;
};

namespace {
/// Weight matrices below this many elements use the serial GEMV for single-token steps.
constexpr int64_t kSmallGemv = int64_t(1) << 18;
/// Products of fewer rows use ops::linear_sgemm on W: with so few rows each weight is used a handful of
/// times, the packed layout gains little, and a short prompt (sq-run) would pay for packing the
/// whole model (a reordered copy of every weight matrix: 0.5 GB for SmolLM2) before its first token.
constexpr int64_t kMatmulMinRows = 32;
}  // namespace

DenseLinear::DenseLinear(Tensor weight, Tensor bias)
    : weight_(std::move(weight)), bias_(std::move(bias)), packed_(std::make_shared<Packed>()) {
  if (weight_.rank() != 2) throw std::invalid_argument("DenseLinear: weight must be rank 2, got " + weight_.shape_string());
  if (!bias_.empty() && bias_.numel() != weight_.dim(0))
    throw std::invalid_argument("DenseLinear: bias " + bias_.shape_string() + " does not match weight " + weight_.shape_string());
}

void DenseLinear::forward(const float* x, int64_t n, float* y) const {
  const int64_t in = in_features(), out = out_features();
  if (n == 1 && in * out < kSmallGemv) {
    // Small decode step: a serial dot product per output row. OpenBLAS would fork threads for
    // anything above ~9k multiply-adds, which costs more than the work here.
    const float* w = weight_.data();
    for (int64_t j = 0; j < out; ++j) {
      const float* row = w + j * in;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < in; ++i) acc += row[i] * x[i];
      y[j] = acc;
    }
  } else if (n == 1) {
    // y[out] = W[out, in] · x[in], each row one fixed-order dot product whatever the threads
    ops::linear_sgemv(x, weight_.data(), out, in, y);
  } else {
    // y[n, out] = x[n, in] · W[out, in]ᵀ
    const ops::WeightMatmul* mm = n >= kMatmulMinRows && n * out * in >= ops::kOneDnnMinMacs ? matmul(n) : nullptr;
    if (!mm || !mm->forward(x, n, y)) ops::linear_sgemm(x, n, weight_.data(), out, in, y);
  }
  if (!bias_.empty()) {
    const float* b = bias_.data();
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < out; ++j) y[t * out + j] += b[j];
  }
}

const ops::WeightMatmul* DenseLinear::matmul(int64_t rows) const {
  std::lock_guard<std::mutex> lock(packed_->mu);
  if (!packed_->tried) {
    packed_->tried = true;
    if (!ops::weight_matmul_pays()) return nullptr;  // no brgemm kernels: ops::linear_sgemm on W is faster
    try {
      packed_->mm = std::make_unique<ops::WeightMatmul>(weight_.data(), out_features(), in_features(),
                                                         prepack_ ? ops::WeightLayout::Packed : ops::WeightLayout::Plain, rows);
    } catch (const std::runtime_error&) {
      // oneDNN has no matmul for this shape: ops::sgemm on W serves every call
    }
  }
  return packed_->mm.get();
}

int64_t DenseLinear::packed_bytes() const {
  std::lock_guard<std::mutex> lock(packed_->mu);
  return packed_->mm ? packed_->mm->packed_bytes() : 0;
}

}  // namespace sq
