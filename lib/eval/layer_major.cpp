#include "eval/layer_major.h"

#include <omp.h>

#include <stdexcept>
#include <string>

#include "core/finite.h"
#include "model/nonfinite.h"
#include "runtime/kv_cache.h"

namespace sq {

LayerMajorLogits::LayerMajorLogits(const LayerStream& stream) : stream_(stream) {}

void LayerMajorLogits::run(const std::vector<std::vector<int32_t>>& inputs, int64_t first_row,
                           const std::function<std::string(size_t)>& where, const std::function<void(int, int)>& on_layer) {
  const Decoder& model = *stream_.model().model;
  const ModelConfig& c = model.config();
  hidden_.clear();
  if (inputs.empty()) return;
  const int64_t n = static_cast<int64_t>(inputs[0].size());
  if (n < 1 || first_row < 0 || first_row >= n)
    throw std::invalid_argument("LayerMajorLogits::run: first row " + std::to_string(first_row) + " of inputs of " +
                                std::to_string(n) + " tokens");
  for (const auto& in : inputs)
    if (static_cast<int64_t>(in.size()) != n) throw std::invalid_argument("LayerMajorLogits::run: inputs of unequal length");
  if (n > c.max_seq_len)
    throw std::length_error("input of " + std::to_string(n) + " tokens exceeds the model's context of " + std::to_string(c.max_seq_len));

  // x [n, dim] per input: the embedding rows, then each layer's output in place.
  std::vector<std::vector<float>> x(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    x[i].resize(static_cast<size_t>(n * c.dim));
    model.embed(inputs[i].data(), n, x[i].data());
  }
  const bool parallel = c.dim < 1024 && omp_get_max_threads() > 1 && inputs.size() > 1;
  const int64_t count = static_cast<int64_t>(inputs.size());
  for (int l = 0; l < c.n_layers; ++l) {
    const std::shared_ptr<const DecoderLayer> layer = stream_.layer(l);  // read once for the whole group
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int64_t i = 0; i < count; ++i) {
      KVCache cache(c, n);
      Workspace ws;
      model.forward_layer(l, *layer, x[static_cast<size_t>(i)].data(), n, cache, ws);
    }
    for (size_t i = 0; i < x.size(); ++i)
      if (first_nonfinite_f32(x[i].data(), static_cast<int64_t>(x[i].size())) >= 0)
        throw nonfinite_activation_error("layer " + std::to_string(l) + " (residual stream)", where(i));
    if (on_layer) on_layer(l + 1, c.n_layers);
  }
  rows_ = n - first_row;
  hidden_.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    hidden_[i].assign(x[i].begin() + first_row * c.dim, x[i].end());
    std::vector<float>().swap(x[i]);
  }
}

void LayerMajorLogits::logits(size_t i, float* out) const {
  stream_.model().model->project(hidden_.at(i).data(), rows_, out);
}

}  // namespace sq
