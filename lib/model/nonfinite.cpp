#include "model/nonfinite.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "core/error.h"
#include "core/finite.h"
#include "model/observer.h"
#include "ops/ops.h"

namespace sq {

namespace {

/// Records the first linear input or output (in data-flow order) that holds a NaN or ±Inf.
class FirstNonFinite final : public ActivationObserver {
 public:
  void on_linear_input(int layer, ActivationSite site, const float* x, int64_t n, int64_t width) override {
    if (found() || first_nonfinite_f32(x, n * width) < 0) return;
    static const char* what[kActivationSites] = {"attention input, the input_layernorm output",
                                                 "attention output, the o_proj input",
                                                 "feed-forward input, the post_attention_layernorm output",
                                                 "feed-forward hidden state silu(gate)*up, the down_proj input"};
    where_ = "layer " + std::to_string(layer) + " (" + what[static_cast<int>(site)] + ")";
  }
  void on_linear_output(int layer, Projection p, const float* y, int64_t n, int64_t width) override {
    if (found() || first_nonfinite_f32(y, n * width) < 0) return;
    const bool attn = p == Projection::Q || p == Projection::K || p == Projection::V || p == Projection::O;
    where_ = "layer " + std::to_string(layer) + " (" + (attn ? "self_attn." : "mlp.") + projection_name(p) + " output)";
  }
  bool found() const { return !where_.empty(); }
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

}  // namespace

std::string locate_nonfinite_activation(const Decoder& model, const int32_t* tokens, int64_t n, KVCache& cache,
                                        Workspace& ws) {
  const ModelConfig& c = model.config();
  const int64_t d = c.dim;
  if (n <= 0) return "";
  std::vector<float> x(static_cast<size_t>(n * d));
  model.embed(tokens, n, x.data());
  if (first_nonfinite_f32(x.data(), n * d) >= 0) return "the token embedding";
  FirstNonFinite obs;
  for (int l = 0; l < c.n_layers; ++l) {
    model.forward_layer(l, model.layers()[static_cast<size_t>(l)], x.data(), n, cache, ws, &obs);
    if (obs.found()) {
      cache.advance(n);
      return obs.where();
    }
    if (first_nonfinite_f32(x.data(), n * d) >= 0) {
      cache.advance(n);
      return "layer " + std::to_string(l) + " (residual stream)";
    }
  }
  cache.advance(n);
  std::vector<float> xn(static_cast<size_t>(n * d));
  ops::rms_norm(x.data(), model.final_norm().data(), xn.data(), n, static_cast<int>(d), c.norm_eps);
  if (first_nonfinite_f32(xn.data(), n * d) >= 0) return "the final norm";
  constexpr int64_t kRows = 64;  // LM head in row blocks: bounded memory for long blocks and large vocabularies
  std::vector<float> logits(static_cast<size_t>(std::min(n, kRows) * c.vocab_size));
  for (int64_t r = 0; r < n; r += kRows) {
    const int64_t rows = std::min(kRows, n - r);
    model.lm_head().forward(xn.data() + r * d, rows, logits.data());
    if (first_nonfinite_f32(logits.data(), rows * c.vocab_size) >= 0) return "the LM head (logits)";
  }
  return "";
}

std::string locate_nonfinite_last_block(const Decoder& model, const int32_t* tokens, int64_t n, KVCache& cache,
                                        Workspace& ws) {
  if (n > cache.length())
    throw std::invalid_argument("locate_nonfinite_last_block: the cache holds " + std::to_string(cache.length()) +
                                " rows, fewer than the block of " + std::to_string(n));
  std::vector<int64_t> keep(static_cast<size_t>(cache.length() - n));
  for (size_t i = 0; i < keep.size(); ++i) keep[i] = static_cast<int64_t>(i);
  cache.keep_rows(keep);
  return locate_nonfinite_activation(model, tokens, n, cache, ws);
}

NonFiniteError nonfinite_activation_error(const std::string& location, const std::string& where) {
  if (location.empty())
    return NonFiniteError("non-finite logits " + where +
                          " (the weights are finite; the layer could not be located on this backend)");
  return NonFiniteError("non-finite activation in " + location + " " + where +
                        " (the weights are finite: the activations overflow FP32 on this input)");
}

}  // namespace sq
