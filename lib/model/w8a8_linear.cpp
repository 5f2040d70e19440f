#include "model/w8a8_linear.h"

#include <cmath>
#include <stdexcept>
#include <utility>

namespace sq {

namespace {

/// Per-thread scratch for the quantized input (reused across calls; forward is reentrant across threads).
template <typename T>
T* scratch(std::vector<T>& buf, int64_t count) {
  if (static_cast<int64_t>(buf.size()) < count) buf.resize(static_cast<size_t>(count));
  return buf.data();
}

}  // namespace

W8A8Linear::QuantizedWeight W8A8Linear::quantize_tensor(const Tensor& weight, WeightGranularity wg) {
  if (weight.rank() != 2 || weight.empty())
    throw std::invalid_argument("W8A8Linear: weight must be a non-empty rank-2 tensor, got " + weight.shape_string());
  QuantizedWeight qw;
  qw.out = weight.dim(0);
  qw.in = weight.dim(1);
  qw.q.resize(static_cast<size_t>(qw.out * qw.in));
  qw.scales.resize(wg == WeightGranularity::PerChannel ? static_cast<size_t>(qw.out) : 1);
  quantize_weight(weight.data(), qw.out, qw.in, wg, qw.q.data(), qw.scales.data());
  return qw;
}

W8A8Linear::W8A8Linear(const Tensor& weight, WeightGranularity wg, ActQuant aq, float static_step, Tensor bias, Int8Backend backend)
    : W8A8Linear(quantize_tensor(weight, wg), wg, aq, static_step, std::move(bias), backend) {}

W8A8Linear::W8A8Linear(QuantizedWeight&& qw, WeightGranularity wg, ActQuant aq, float static_step, Tensor bias, Int8Backend backend)
    : W8A8Linear(std::move(qw.q), std::move(qw.scales), qw.out, qw.in, wg, aq, static_step, std::move(bias), backend) {}

W8A8Linear::W8A8Linear(std::vector<int8_t> q, std::vector<float> scales, int64_t out, int64_t in, WeightGranularity wg, ActQuant aq,
                       float static_step, Tensor bias, Int8Backend backend)
    : out_(out),
      in_(in),
      wg_(wg),
      aq_(aq),
      static_step_(aq == ActQuant::PerTensorStatic ? static_step : 0.0f),
      scales_(std::move(scales)),
      bias_(std::move(bias)),
      packed_(validated(q), out, in, backend) {}

const int8_t* W8A8Linear::validated(const std::vector<int8_t>& q) const {
  std::string shape = "[";
  shape += std::to_string(out_);
  shape += ", ";
  shape += std::to_string(in_);
  shape += "]";
  if (out_ <= 0 || in_ <= 0) throw std::invalid_argument("W8A8Linear: empty weight " + shape);
  if (static_cast<int64_t>(q.size()) != out_ * in_)
    throw std::invalid_argument("W8A8Linear: " + std::to_string(q.size()) + " INT8 weights do not match shape " + shape);
  for (const int8_t v : q)
    if (v == -128) throw std::invalid_argument("W8A8Linear: INT8 weight value -128 is outside the symmetric range [-127, 127]");
  const size_t want = wg_ == WeightGranularity::PerChannel ? static_cast<size_t>(out_) : 1;
  if (scales_.size() != want)
    throw std::invalid_argument(std::string("W8A8Linear: ") + to_string(wg_) + " weight of shape " + shape + " needs " +
                                std::to_string(want) + " scales, got " + std::to_string(scales_.size()));
  for (const float s : scales_)
    if (!(std::isfinite(s) && s > 0.0f)) throw std::invalid_argument("W8A8Linear: weight scale " + std::to_string(s) + " is not finite and > 0");
  if (aq_ == ActQuant::PerTensorStatic && !(std::isfinite(static_step_) && static_step_ > 0.0f))
    throw std::invalid_argument("W8A8Linear: per-tensor static activation quantization needs a finite static step > 0, got " +
                                std::to_string(static_step_));
  if (!bias_.empty() && bias_.numel() != out_)
    throw std::invalid_argument("W8A8Linear: bias " + bias_.shape_string() + " does not match " + std::to_string(out_) + " outputs");
  return q.data();
}

Int8Dequant W8A8Linear::dequant(const float* x_scales) const {
  Int8Dequant dq;
  dq.a_scales = x_scales;
  dq.a_per_row = aq_ == ActQuant::PerToken;
  dq.b_scales = scales_.data();
  dq.b_per_col = wg_ == WeightGranularity::PerChannel;
  dq.bias = bias_.empty() ? nullptr : bias_.data();
  dq.a_group = aq_ == ActQuant::PerTokenGroup ? kActGroupSize : 0;
  return dq;
}

void W8A8Linear::forward(const float* x, int64_t n, float* y) const {
  if (n < 0) throw std::invalid_argument("W8A8Linear::forward: negative row count " + std::to_string(n));
  if (n == 0) return;
  static thread_local std::vector<uint8_t> qbuf;
  static thread_local std::vector<float> sbuf;
  const int64_t ld = packed_.padded_k();
  uint8_t* xq = scratch(qbuf, n * ld);
  float* xs = scratch(sbuf, act_scale_count(aq_, n, in_));
  quantize_activations_u8(x, n, in_, aq_, static_step_, xq, ld, xs);
  packed_.gemm_f32_biased(xq, ld, n, dequant(xs), y);
}

void W8A8Linear::quantize_input(const float* x, int64_t n, int8_t* xq, float* x_scales) const {
  quantize_activations(x, n, in_, aq_, static_step_, xq, x_scales);
}

void W8A8Linear::forward_quantized(const int8_t* xq, const float* x_scales, int64_t n, float* y) const {
  if (n < 0) throw std::invalid_argument("W8A8Linear::forward_quantized: negative row count " + std::to_string(n));
  if (n == 0) return;
  packed_.gemm_f32(xq, n, dequant(x_scales), y);
}

bool W8A8Linear::shares_input_quantization(const W8A8Linear& o) const {
  return in_ == o.in_ && aq_ == o.aq_ && static_step_ == o.static_step_ && packed_.padded_k() == o.packed_.padded_k() &&
         packed_.backend() == o.packed_.backend();
}

void W8A8Linear::quantize_input_u8(const float* x, int64_t n, QuantizedInput& out, int64_t hadamard_block) const {
  out.n = n;
  out.ld = packed_.padded_k();
  out.q.resize(static_cast<size_t>(n * out.ld));
  out.scales.resize(static_cast<size_t>(act_scale_count(aq_, n, in_)));
  if (hadamard_block == 0) {
    quantize_activations_u8(x, n, in_, aq_, static_step_, out.q.data(), out.ld, out.scales.data());
    return;
  }
  if (!quantizes_rows_independently())
    throw std::invalid_argument(std::string("W8A8Linear::quantize_input_u8: a rotated input is quantized here per token or per token "
                                            "group only, not ") + to_string(aq_) + " (rotate it first: HadamardInputLinear::rotated_input)");
  quantize_activations_u8_hadamard(x, n, in_, hadamard_block, aq_, out.q.data(), out.ld, out.scales.data());
}

void W8A8Linear::forward_prequantized(const QuantizedInput& in, float* y) const {
  if (in.n == 0) return;
  if (in.ld != packed_.padded_k())
    throw std::invalid_argument("W8A8Linear::forward_prequantized: input quantized for another row width");
  packed_.gemm_f32_biased(in.q.data(), in.ld, in.n, dequant(in.scales.data()), y);
}

std::string W8A8Linear::format() const { return std::string("w8a8-") + to_string(wg_) + "-" + to_string(aq_); }

int64_t W8A8Linear::weight_bytes() const {
  return out_ * in_ + static_cast<int64_t>(scales_.size()) * 4 + bias_.numel() * 4;
}

std::vector<int8_t> W8A8Linear::quantized_weight() const {
  std::vector<int8_t> q(static_cast<size_t>(out_ * in_));
  packed_.unpack(q.data());
  return q;
}

}  // namespace sq
