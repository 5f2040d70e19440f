#include "calib/hessian.h"

#include "calib/window_runner.h"
#include "ops/hadamard.h"
#include "ops/ops.h"
#include "ops/sgemm.h"

#include <omp.h>

#include <algorithm>
#include <numeric>
#include <memory>
#include <stdexcept>
#include <string>

namespace sq {

HessianAccumulator::HessianAccumulator(int64_t width) : width_(width) {
  if (width < 0) throw std::invalid_argument("HessianAccumulator: negative width");
  sum_.assign(static_cast<size_t>(width * width), 0.0);
}

void HessianAccumulator::observe(const float* x, int64_t n) {
  if (n <= 0 || width_ == 0) {
    tokens_ += std::max<int64_t>(n, 0);
    return;
  }
  const int64_t d = width_;
  // 2·XᵀX of each block of at most kProductRows rows in FP32 (ssyrk: twice dsyrk's rate, and no
  // FP64 copy of X), added into the FP64 sums. Each FP32 entry sums ≤ 512 products: relative error
  // ~√512·2⁻²⁴ ≈ 1.3e-6 typically (≤ 512·2⁻²⁴ ≈ 3e-5 of Σ|x_i x_j| at worst), where the reference
  // GPTQ (gptq.py add_batch) accumulates the whole Hessian in FP32; across blocks, windows and
  // threads the sums are FP64.
  if (block_.size() != static_cast<size_t>(d * d)) block_.assign(static_cast<size_t>(d * d), 0.0f);
  for (int64_t r0 = 0; r0 < n; r0 += kProductRows) {
    const int64_t rows = std::min(kProductRows, n - r0);
    ops::ssyrk_upper(d, rows, 2.0f, x + r0 * d, d, 0.0f, block_.data(), d);
    double* sum = sum_.data();
    const float* blk = block_.data();
#pragma omp parallel for schedule(static) if (d >= 512 && omp_get_level() == 0)
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = i; j < d; ++j) sum[i * d + j] += static_cast<double>(blk[i * d + j]);
  }
  tokens_ += n;
}

void HessianAccumulator::merge(const HessianAccumulator& o) {
  if (o.width_ != width_)
    throw std::invalid_argument("HessianAccumulator::merge: widths differ (" + std::to_string(width_) + " vs " +
                                std::to_string(o.width_) + ")");
  for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += o.sum_[i];
  tokens_ += o.tokens_;
}

std::vector<double> HessianAccumulator::hessian() const {
  if (tokens_ == 0) throw std::logic_error("HessianAccumulator::hessian: no tokens observed");
  const int64_t d = width_;
  const double inv = 1.0 / static_cast<double>(tokens_);
  std::vector<double> h(sum_.size());
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = i; j < d; ++j) {
      const double v = sum_[static_cast<size_t>(i * d + j)] * inv;
      h[static_cast<size_t>(i * d + j)] = v;
      h[static_cast<size_t>(j * d + i)] = v;
    }
  return h;
}

std::vector<double> HessianAccumulator::take_hessian() {
  if (tokens_ == 0) throw std::logic_error("HessianAccumulator::take_hessian: no tokens observed");
  const int64_t d = width_;
  const double inv = 1.0 / static_cast<double>(tokens_);
  for (int64_t i = 0; i < d; ++i)  // the same products as hessian(), written in place
    for (int64_t j = i; j < d; ++j) {
      const double v = sum_[static_cast<size_t>(i * d + j)] * inv;
      sum_[static_cast<size_t>(i * d + j)] = v;
      sum_[static_cast<size_t>(j * d + i)] = v;
    }
  std::vector<double> h = std::move(sum_);
  sum_.clear();
  std::vector<float>().swap(block_);
  tokens_ = 0;
  width_ = 0;
  return h;
}

HessianCollector::HessianCollector(const ModelConfig& c) {
  const int64_t d = c.dim, q = int64_t(c.n_heads) * c.head_dim, h = c.hidden_dim;
  const int64_t widths[kActivationSites] = {d, q, d, h};
  sites_.reserve(static_cast<size_t>(c.n_layers) * kActivationSites);
  for (int l = 0; l < c.n_layers; ++l)
    for (int s = 0; s < kActivationSites; ++s) sites_.emplace_back(widths[s]);
}

HessianCollector::HessianCollector(const Decoder& model) : HessianCollector(model.config()) { model_ = &model; }

void HessianCollector::on_linear_input(int layer, ActivationSite site, const float* x, int64_t n, int64_t width) {
  HessianAccumulator& a = at(layer, site);
  if (width != a.width())
    throw std::invalid_argument(std::string("HessianCollector: ") + activation_site_name(site) + " of layer " +
                                std::to_string(layer) + " has width " + std::to_string(width) + ", expected " +
                                std::to_string(a.width()));
  a.observe(x, n);
  if (site == ActivationSite::FfnInput && model_ && model_->config().spec.n_experts > 0) observe_expert_hidden(layer, x, n);
}

void HessianCollector::observe_expert_hidden(int layer, const float* h, int64_t n) {
  // Decoder::run_experts' routing, step for step: p = softmax(router(h)) per token (ops::softmax_row),
  // the top K by p in torch.topk order (std::stable_sort), then act(gate(x)) ⊙ up(x) per expert.
  const ModelConfig& c = model_->config();
  const int E = c.spec.n_experts, K = c.spec.experts_per_token;
  const int64_t d = c.dim, hid = c.hidden_dim;
  const DecoderLayer& L = model_->layers()[static_cast<size_t>(layer)];
  std::vector<float> p(static_cast<size_t>(n * E));  // [n, E]
  L.router->forward(h, n, p.data());
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(E));  // tokens routed to each expert
  std::vector<int> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    float* pt = p.data() + t * E;
    ops::softmax_row(pt, E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pt[a] > pt[b]; });
    for (int k = 0; k < K; ++k) rows[static_cast<size_t>(order[static_cast<size_t>(k)])].push_back(t);
  }
  std::vector<float> x, gate, up;
  for (int e = 0; e < E; ++e) {
    const std::vector<int64_t>& r = rows[static_cast<size_t>(e)];
    const int64_t m = static_cast<int64_t>(r.size());
    if (m == 0) continue;
    x.resize(static_cast<size_t>(m * d));  // [m, d] gathered inputs
    gate.resize(static_cast<size_t>(m * hid));
    up.resize(static_cast<size_t>(m * hid));
    for (int64_t i = 0; i < m; ++i) std::copy_n(h + r[static_cast<size_t>(i)] * d, d, x.begin() + i * d);
    const Expert& X = L.experts[static_cast<size_t>(e)];
    X.gate_proj->forward(x.data(), m, gate.data());  // [m, hid]
    X.up_proj->forward(x.data(), m, up.data());
    ops::gated_activation(c.spec.activation, gate.data(), up.data(), m * hid);  // down_proj's input
    at(layer, ActivationSite::FfnHidden).observe(gate.data(), m);
  }
}

void HessianCollector::merge(const HessianCollector& o) {
  if (o.sites_.size() != sites_.size()) throw std::invalid_argument("HessianCollector::merge: layer counts differ");
  for (size_t i = 0; i < sites_.size(); ++i) sites_[i].merge(o.sites_[i]);
}

const HessianAccumulator& HessianCollector::at(int layer, ActivationSite site) const {
  if (layer < 0 || layer >= n_layers())
    throw std::out_of_range("HessianCollector: layer " + std::to_string(layer) + " out of range");
  return sites_[static_cast<size_t>(layer) * kActivationSites + static_cast<size_t>(site)];
}

HessianAccumulator& HessianCollector::at(int layer, ActivationSite site) {
  return const_cast<HessianAccumulator&>(static_cast<const HessianCollector&>(*this).at(layer, site));
}

HessianCollector collect_hessians(const Decoder& model, const std::vector<std::vector<int32_t>>& windows,
                                  const std::function<void(int64_t, int64_t)>& progress) {
  return observe_windows<HessianCollector>(model, windows, progress);
}

void transform_hessian(std::vector<double>& H, int64_t n, const std::vector<float>& smoothing, int64_t rotation_block) {
  if (n < 0 || H.size() != size_t(n) * size_t(n))
    throw std::invalid_argument("transform_hessian: H holds " + std::to_string(H.size()) + " values, expected " + std::to_string(n) + "²");
  if (!smoothing.empty() && smoothing.size() != size_t(n))
    throw std::invalid_argument("transform_hessian: " + std::to_string(smoothing.size()) + " smoothing factors for width " + std::to_string(n));
  if (rotation_block != 0 && n > 0) ops::check_hadamard_block(n, rotation_block, "transform_hessian");  // before H is touched
  if (!smoothing.empty())
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) H[size_t(i * n + j)] /= double(smoothing[size_t(i)]) * double(smoothing[size_t(j)]);
  if (rotation_block == 0 || n == 0) return;
  // H' = R·H·R: rotate the rows (H·R, R symmetric), transpose (R·H, H symmetric), rotate the rows again.
  ops::hadamard_rows(H.data(), n, n, rotation_block);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) std::swap(H[size_t(i * n + j)], H[size_t(j * n + i)]);
  ops::hadamard_rows(H.data(), n, n, rotation_block);
}

}  // namespace sq
