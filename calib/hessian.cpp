#include "calib/hessian.h"

#include "calib/window_runner.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
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
  const int64_t block = std::max<int64_t>(1, std::min<int64_t>(n, (int64_t{1} << 20) / d));  // ≤ 8 MiB of doubles
  std::vector<double> xd(static_cast<size_t>(block * d));
  for (int64_t r0 = 0; r0 < n; r0 += block) {
    const int64_t rows = std::min(block, n - r0);
    const float* src = x + r0 * d;
    for (int64_t i = 0; i < rows * d; ++i) xd[static_cast<size_t>(i)] = static_cast<double>(src[i]);
    // sum_ (upper) += 2 · Xᵀ X
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(d), static_cast<int>(rows), 2.0, xd.data(),
                static_cast<int>(d), 1.0, sum_.data(), static_cast<int>(d));
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

HessianCollector::HessianCollector(const ModelConfig& c) {
  const int64_t d = c.dim, q = int64_t(c.n_heads) * c.head_dim, h = c.hidden_dim;
  const int64_t widths[kActivationSites] = {d, q, d, h};
  sites_.reserve(static_cast<size_t>(c.n_layers) * kActivationSites);
  for (int l = 0; l < c.n_layers; ++l)
    for (int s = 0; s < kActivationSites; ++s) sites_.emplace_back(widths[s]);
}

void HessianCollector::on_linear_input(int layer, ActivationSite site, const float* x, int64_t n, int64_t width) {
  HessianAccumulator& a = at(layer, site);
  if (width != a.width())
    throw std::invalid_argument(std::string("HessianCollector: ") + activation_site_name(site) + " of layer " +
                                std::to_string(layer) + " has width " + std::to_string(width) + ", expected " +
                                std::to_string(a.width()));
  a.observe(x, n);
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

}  // namespace sq
