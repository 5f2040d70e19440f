#include "calib/channel_reorder.h"

#include "model/decoder_linears.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "core/error.h"

namespace sq {

int64_t atom_outlier_count(int64_t in, int64_t requested) {
  if (requested < 0) return std::min(kAtomDefaultOutliers, in / kAtomOutlierCapDivisor);
  if (requested >= in)
    throw UsageError("--outlier-channels " + std::to_string(requested) + " is not below the linear input width " + std::to_string(in) +
                     " (at least one channel must stay INT4)");
  return requested;
}

std::vector<int32_t> outlier_channel_order(const std::vector<double>& sum_sq, int64_t n_outlier) {
  const int64_t in = static_cast<int64_t>(sum_sq.size());
  if (n_outlier < 0 || n_outlier >= in)
    throw std::invalid_argument("outlier_channel_order: n_outlier = " + std::to_string(n_outlier) + " not in [0, " + std::to_string(in) + ")");
  std::vector<int32_t> by_energy(static_cast<size_t>(in));
  std::iota(by_energy.begin(), by_energy.end(), 0);
  std::stable_sort(by_energy.begin(), by_energy.end(), [&](int32_t a, int32_t b) { return sum_sq[size_t(a)] > sum_sq[size_t(b)]; });
  std::vector<char> outlier(static_cast<size_t>(in), 0);
  for (int64_t k = 0; k < n_outlier; ++k) outlier[size_t(by_energy[size_t(k)])] = 1;
  std::vector<int32_t> order;
  order.reserve(static_cast<size_t>(in));
  for (int32_t c = 0; c < in; ++c)
    if (!outlier[size_t(c)]) order.push_back(c);
  for (int32_t c = 0; c < in; ++c)
    if (outlier[size_t(c)]) order.push_back(c);
  return order;
}

namespace {
void check_order(const char* what, int64_t n, const std::vector<int32_t>& order) {
  if (static_cast<int64_t>(order.size()) != n)
    throw std::invalid_argument(std::string(what) + ": order has " + std::to_string(order.size()) + " entries, expected " + std::to_string(n));
}
}  // namespace

Tensor permute_columns(const Tensor& w, const std::vector<int32_t>& order) {
  if (w.rank() != 2) throw std::invalid_argument("permute_columns: rank-2 tensor expected, got " + w.shape_string());
  const int64_t out = w.dim(0), in = w.dim(1);
  check_order("permute_columns", in, order);
  std::vector<float> v(static_cast<size_t>(out * in));
  for (int64_t r = 0; r < out; ++r)
    for (int64_t p = 0; p < in; ++p) v[size_t(r * in + p)] = w.data()[r * in + order[size_t(p)]];
  return Tensor::from_vector({out, in}, std::move(v));
}

Tensor permute_rows(const Tensor& w, const std::vector<int32_t>& order) {
  if (w.rank() < 1) throw std::invalid_argument("permute_rows: tensor of rank ≥ 1 expected");
  const int64_t rows = w.dim(0), cols = w.numel() / std::max<int64_t>(rows, 1);
  check_order("permute_rows", rows, order);
  std::vector<float> v(static_cast<size_t>(w.numel()));
  for (int64_t p = 0; p < rows; ++p) std::copy_n(w.data() + order[size_t(p)] * cols, cols, v.data() + p * cols);
  return Tensor::from_vector(w.shape(), std::move(v));
}

std::vector<double> permute_hessian(const std::vector<double>& h, const std::vector<int32_t>& order) {
  const int64_t n = static_cast<int64_t>(order.size());
  if (static_cast<int64_t>(h.size()) != n * n)
    throw std::invalid_argument("permute_hessian: H has " + std::to_string(h.size()) + " entries, expected " + std::to_string(n * n));
  std::vector<double> r(h.size());
  for (int64_t p = 0; p < n; ++p)
    for (int64_t q = 0; q < n; ++q) r[size_t(p * n + q)] = h[size_t(int64_t(order[size_t(p)]) * n + order[size_t(q)])];
  return r;
}

void fold_ffn_hidden_order(Checkpoint& ck, int layer, const std::vector<int32_t>& order) {
  // The producers of ffn_hidden (gate/up, fc1, every expert's gate/up) get their rows permuted;
  // its readers (down_proj, fc2, every expert's down_proj) their columns.
  for (const LinearSlot& s : decoder_layer_linears(ck.config, layer)) {
    if (s.role == LinearRole::Router) continue;
    const std::string w = s.name + ".weight", b = s.name + ".bias";
    if (s.site == ActivationSite::FfnInput) {
      ck.tensors[w] = permute_rows(ck.get(w, {s.out, s.in}), order);
      if (ck.has(b)) ck.tensors[b] = permute_rows(ck.get(b, {s.out}), order);
    } else if (s.site == ActivationSite::FfnHidden) {
      ck.tensors[w] = permute_columns(ck.get(w, {s.out, s.in}), order);
    }
  }
}

}  // namespace sq
