#include "model/w4a4_linear.h"


#include <stdexcept>
#include <utility>

#include "formats/safetensors.h"
#include "ops/sgemm.h"
#include "quant/gemm_common.h"

namespace sq {

const char* to_string(W4A4OutlierFormat f) { return f == W4A4OutlierFormat::Fp32 ? "fp32" : "int8"; }

int64_t w4a4_kernel_group(int64_t in_normal, int64_t group) {
  if (group != 0 && group != 32 && group != 64 && group != 128)
    throw std::invalid_argument("W4A4: group size " + std::to_string(group) + " is not 0 (one group per row), 32, 64 or 128");
  if (in_normal <= 0) throw std::invalid_argument("W4A4: no INT4 channels (in − n_outlier = " + std::to_string(in_normal) + ")");
  return group == 0 || group >= in_normal ? gemm::round_up(in_normal, 8) : group;
}

int64_t w4a4_stored_groups(int64_t in_normal, int64_t group) {
  return group == 0 || group >= in_normal ? 1 : (in_normal + group - 1) / group;
}

W4A4Weights W4A4Linear::quantize_tensor(const Tensor& weight, int64_t n_outlier, int64_t group, float weight_clip) {
  if (weight.rank() != 2 || weight.empty())
    throw std::invalid_argument("W4A4Linear: weight must be a non-empty rank-2 tensor, got " + weight.shape_string());
  return quantize_w4a4_weights(weight.data(), weight.dim(0), weight.dim(1), n_outlier, group, weight_clip);
}

W4A4Weights W4A4Linear::kernel_weights(const W4A4LinearData& d) {
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument("W4A4LinearData [out = " + std::to_string(d.out) + ", in = " + std::to_string(d.in) +
                                ", n_outlier = " + std::to_string(d.n_outlier) + ", group = " + std::to_string(d.group) + "]: " + what);
  };
  if (d.out <= 0 || d.in <= 0) fail("empty shape");
  if (d.n_outlier < 0 || d.n_outlier >= d.in) fail("n_outlier must lie in [0, in)");
  const int64_t inn = d.in - d.n_outlier;
  const int64_t gk = w4a4_kernel_group(inn, d.group), G = w4a4_stored_groups(inn, d.group);
  const int64_t padded = gemm::round_up(inn, gk);
  if (!d.order.empty()) {
    if (static_cast<int64_t>(d.order.size()) != d.in) fail("order has " + std::to_string(d.order.size()) + " entries");
    std::vector<char> seen(static_cast<size_t>(d.in), 0);
    for (int32_t c : d.order) {
      if (c < 0 || c >= d.in || seen[size_t(c)]) fail("order is not a permutation of 0 … in−1 (entry " + std::to_string(c) + ")");
      seen[size_t(c)] = 1;
    }
  }
  if (static_cast<int64_t>(d.codes.size()) != d.out * inn) fail("codes has " + std::to_string(d.codes.size()) + " entries");
  if (static_cast<int64_t>(d.scales_f16.size()) != d.out * G) fail("scales_f16 has " + std::to_string(d.scales_f16.size()) + " entries");
  const bool int8 = d.outlier_format == W4A4OutlierFormat::Int8;
  if (int8 && d.n_outlier > 0) {
    if (static_cast<int64_t>(d.outlier_codes.size()) != d.out * d.n_outlier) fail("outlier_codes size");
    if (static_cast<int64_t>(d.outlier_scales.size()) != d.out) fail("outlier_scales size");
  } else if (!int8 && static_cast<int64_t>(d.outlier_weights.size()) != d.out * d.n_outlier) {
    fail("outlier_weights size");
  }
  // Kernel layout: INT4 codes padded with 0 to whole groups of gk, the scales of a ragged / whole-row
  // group reused for its padding (the padding's codes are 0, so the value does not matter).
  const int64_t n8 = int8 ? d.n_outlier : 0;
  std::vector<int8_t> codes(static_cast<size_t>(d.out * padded), 0);
  std::vector<float> scales(static_cast<size_t>(d.out * (padded / gk)));
  for (int64_t r = 0; r < d.out; ++r) {
    for (int64_t c = 0; c < inn; ++c) codes[size_t(r * padded + c)] = d.codes[size_t(r * inn + c)];
    for (int64_t j = 0; j < padded / gk; ++j) scales[size_t(r * (padded / gk) + j)] = half_to_float(d.scales_f16[size_t(r * G + j)]);
  }
  return w4a4_weights_from_codes(d.out, padded + n8, n8, gk, codes.data(), scales.data(), n8 ? d.outlier_codes.data() : nullptr,
                                 n8 ? d.outlier_scales.data() : nullptr);
}

W4A4Linear::W4A4Linear(const Tensor& weight, int64_t n_outlier, int64_t group, float weight_clip, float act_clip, Tensor bias,
                       W4A4Backend backend)
    : W4A4Linear(quantize_tensor(weight, n_outlier, group, weight_clip), act_clip, std::move(bias), backend) {}

W4A4Linear::W4A4Linear(const W4A4Weights& weights, float act_clip, Tensor bias, W4A4Backend backend)
    : out_(weights.out),
      in_(weights.in),
      n_outlier_(weights.n_outlier),
      group_(weights.group),
      x_in_(weights.in),
      act_clip_(act_clip),
      storage_bytes_(w4a4_storage_bytes(weights)),
      bias_(std::move(bias)),
      packed_(weights, backend) {  // validates the weights
  if (!(act_clip > 0.0f && act_clip <= 1.0f))
    throw std::invalid_argument("W4A4Linear: activation clipping ratio " + std::to_string(act_clip) + " is outside (0, 1]");
  if (!bias_.empty() && bias_.numel() != out_)
    throw std::invalid_argument("W4A4Linear: bias " + bias_.shape_string() + " does not match " + std::to_string(out_) + " outputs");
}

W4A4Linear::W4A4Linear(const W4A4LinearData& d, W4A4Backend backend) : W4A4Linear(kernel_weights(d), d.act_clip, d.bias, backend) {
  x_in_ = d.in;
  const int64_t inn = d.in - d.n_outlier, padded = in_ - n_outlier_;
  auto channel = [&](int64_t p) { return d.order.empty() ? static_cast<int32_t>(p) : d.order[size_t(p)]; };
  bool identity = padded == inn && in_ == d.in;
  for (int64_t p = 0; identity && p < d.in; ++p) identity = channel(p) == p;
  if (!identity) {
    source_.assign(static_cast<size_t>(in_), -1);
    for (int64_t p = 0; p < inn; ++p) source_[size_t(p)] = channel(p);
    for (int64_t j = 0; j < n_outlier_; ++j) source_[size_t(padded + j)] = channel(inn + j);
  }
  if (d.outlier_format == W4A4OutlierFormat::Fp32 && d.n_outlier > 0) {
    for (int64_t j = 0; j < d.n_outlier; ++j) fp_outlier_src_.push_back(channel(inn + j));
    fp_outlier_w_ = Tensor::from_vector({d.out, d.n_outlier}, d.outlier_weights);
  }
}

void W4A4Linear::quantize_input(const float* x, int64_t n, W4A4Activations& out) const {
  if (source_.empty()) quantize_w4a4_activations(x, n, in_, n_outlier_, group_, act_clip_, out);
  else quantize_w4a4_activations_mapped(x, n, x_in_, source_.data(), in_, n_outlier_, group_, act_clip_, out);
}

void W4A4Linear::forward_quantized(const W4A4Activations& a, float* y) const {
  if (!fp_outlier_w_.empty()) throw std::logic_error("W4A4Linear::forward_quantized: FP32 outliers need the FP32 input (use forward)");
  packed_.gemm(a, bias_.empty() ? nullptr : bias_.data(), y);
}

void W4A4Linear::forward(const float* x, int64_t n, float* y) const {
  if (n < 0) throw std::invalid_argument("W4A4Linear::forward: negative row count " + std::to_string(n));
  if (n == 0) return;
  static thread_local W4A4Activations buf;  // reused across calls; forward is reentrant across threads
  quantize_input(x, n, buf);
  packed_.gemm(buf, bias_.empty() ? nullptr : bias_.data(), y);
  if (!fp_outlier_w_.empty()) {
    // y += x[:, outliers] · W_outᵀ in FP32 (Atom Table 3's "outliers kept in FP" step).
    const int64_t no = fp_outlier_w_.dim(1);
    float* xo = gemm::thread_scratch<float>(n * no);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < no; ++j) xo[i * no + j] = x[i * x_in_ + fp_outlier_src_[size_t(j)]];
    ops::sgemm(false, true, n, out_, no, 1.0f, xo, no, fp_outlier_w_.data(), no, 1.0f, y, out_);
  }
}

std::string W4A4Linear::format() const {
  return "w4a4-g" + std::to_string(group_) + "-o" + std::to_string(n_outlier_ + fp32_outliers()) + (fp_outlier_w_.empty() ? "" : "-fp32");
}

}  // namespace sq
