// CudaDecoder (cuda/cuda_decoder.h): uploads a Decoder and runs its layers through
// run_decoder_layer (model/decoder_layer_flow.h) with the CUDA backend below. Device-neutral C++
// over cuda/cuda_ops.h, cuda/cuda_linear.h and cuda/cuda_kv_cache.h.
#include "cuda/cuda_decoder.h"

#include <numeric>
#include <stdexcept>
#include <string>

#include "core/error.h"
#include "core/rope_frequencies.h"
#include "cuda/cuda_ops.h"
#include "model/decoder_layer_flow.h"

namespace sq {

namespace {

/// A host tensor on the device as FP32 (an empty array for an empty tensor: an unused weight).
DeviceArray<float> upload(const Tensor& t) {
  return t.empty() ? DeviceArray<float>() : DeviceArray<float>(t.data(), static_cast<size_t>(t.numel()));
}

/// A host linear on the device, or null when the layer does not have it.
std::unique_ptr<cuda::DeviceLinear> upload(const std::unique_ptr<Linear>& f, const std::string& name) {
  return f ? cuda::upload_linear(*f, name) : nullptr;
}

float* or_null(const DeviceArray<float>& a) { return a.size() ? a.data() : nullptr; }

}  // namespace

/// The CUDA backend of run_decoder_layer: cuda/cuda_ops.h on the CudaDecoder's scratch, attention
/// through the CudaKVCache of this forward. No ActivationObserver (calibration runs on the CPU).
struct CudaLayerBackend {
  using Layer = CudaDecoderLayer;
  using Linear = cuda::DeviceLinear;
  CudaDecoder& m;
  CudaKVCache& cache;
  const ModelConfig& c;

  LayerBuffers buffers(int64_t) {
    return {m.xn_.data(),   m.q_.data(),    m.k_.data(),  m.v_.data(),      m.att_.data(),   m.proj_.data(),
            m.proj2_.data(), m.gate_.data(), m.up_.data(), or_null(m.router_), or_null(m.moe_x_), or_null(m.moe_out_)};
  }
  void norm(const float* x, const DeviceArray<float>& w, const DeviceArray<float>& b, float* y, int64_t rows, int width) {
    cuda::norm(c.spec.norm, x, w.data(), or_null(b), y, rows, width, c.norm_eps);
  }
  void rms_norm(float* x, const DeviceArray<float>& w, int64_t rows, int width) {
    cuda::norm(NormKind::RMSNorm, x, w.data(), nullptr, x, rows, width, c.norm_eps);
  }
  void add_norm(float* x, const float* r, const DeviceArray<float>& w, const DeviceArray<float>& b, float* y, int64_t rows, int width) {
    cuda::add_inplace(x, r, rows * width);
    norm(x, w, b, y, rows, width);
  }
  // Device linears keep per-call scratch, so they are not const (the layer's unique_ptrs give non-const access).
  void linear(Linear& f, const float* x, int64_t rows, float* y) { f.forward(x, rows, y, Stream{}); }
  void linears(std::initializer_list<std::pair<Linear*, float*>> fs, const float* x, int64_t rows) {
    for (const auto& [f, y] : fs) linear(*f, x, rows, y);
  }
  void attend(int l, int64_t n) {
    const int hd = c.head_dim;
    if (c.spec.position == PositionKind::Rope)
      cuda::rope(m.q_.data(), m.positions_.data(), n, c.n_heads, hd, c.rope_dim(), m.rope_inv_freq_[size_t(l)].data(), c.rope_layout);
    // The cache rotates the keys itself unless its format keeps them before RoPE (cuda/cuda_kv_cache.h).
    cache.append(l, m.k_.data(), m.v_.data(), n, m.positions_.data());
    cuda::AttentionOptions opt;
    opt.scale = c.spec.attn_scale;
    opt.window = c.window(l);
    opt.alibi_slopes = or_null(m.alibi_slopes_);
    cache.attend(l, m.q_.data(), n, m.att_.data(), opt);
  }
  void add(float* y, const float* x, int64_t count) { cuda::add_inplace(y, x, count); }
  void activation(float* x, int64_t count) { cuda::activation(c.spec.activation, x, count); }
  void gated_activation(float* gate, const float* up, int64_t count) { cuda::gated_activation(c.spec.activation, gate, up, count); }
  const float* host_rows(const float* x, int64_t count) {
    m.host_router_.resize(static_cast<size_t>(count));
    if (x != m.router_.data()) throw std::logic_error("CudaDecoder: only the router logits are read back to the host");
    m.router_.download(m.host_router_.data(), static_cast<size_t>(count));
    return m.host_router_.data();
  }
  void zero(float* y, int64_t count) { cuda::fill(y, count, 0.0f); }
  void gather_rows(const float* x, const std::vector<int32_t>& rows, int width, float* out) {
    m.moe_rows_.upload(rows.data(), rows.size());
    cuda::gather_rows(x, m.moe_rows_.data(), static_cast<int64_t>(rows.size()), width, out);
  }
  void scatter_add_rows(float* y, const float* src, const std::vector<int32_t>& rows, const std::vector<float>& w, int width) {
    m.moe_rows_.upload(rows.data(), rows.size());
    m.moe_w_.upload(w.data(), w.size());
    cuda::scatter_add_rows(y, src, m.moe_rows_.data(), m.moe_w_.data(), static_cast<int64_t>(rows.size()), width);
  }
  bool observing() const { return false; }
  void observe_input(int, ActivationSite, const float*, int64_t, int64_t) {}
  void observe_output(int, Projection, const float*, int64_t, int64_t) {}
  void observe_kv(int, const float*, const float*, int64_t, int64_t) {}
};

CudaDecoder::CudaDecoder(const Decoder& model) : host_(&model), config_(model.config()) {
  const ModelConfig& c = config_;
  if (c.n_layers > 0 && !model.layers().front().q_proj)
    throw std::logic_error("CudaDecoder: the model has no layers (a layer-streamed model's globals, model/layer_stream.h)");
  // Formats first (upload_linear refuses an unsupported one by name before touching the device),
  // then the device.
  auto check = [](const std::unique_ptr<Linear>& f, const std::string& name) {
    if (f) cuda::check_device_linear_format(*f, name);
  };
  for (int l = 0; l < c.n_layers; ++l) {
    const DecoderLayer& L = model.layers()[size_t(l)];
    const std::string p = "layer " + std::to_string(l) + " ";
    for (const auto& [f, name] : {std::pair{&L.q_proj, "q_proj"}, {&L.k_proj, "k_proj"}, {&L.v_proj, "v_proj"}, {&L.o_proj, "o_proj"},
                                  {&L.gate_proj, "gate_proj"}, {&L.up_proj, "up_proj"}, {&L.down_proj, "down_proj"}, {&L.router, "router"}})
      check(*f, p + name);
    for (size_t e = 0; e < L.experts.size(); ++e) {
      const std::string x = p + "expert " + std::to_string(e) + " ";
      check(L.experts[e].gate_proj, x + "gate_proj");
      check(L.experts[e].up_proj, x + "up_proj");
      check(L.experts[e].down_proj, x + "down_proj");
    }
  }
  cuda::check_device_linear_format(model.lm_head(), "the LM head");
  require_cuda("CUDA runner");

  for (int l = 0; l < c.n_layers; ++l) rope_inv_freq_.push_back(rope_inv_freq(c, l));
  if (!model.alibi_slopes().empty()) alibi_slopes_ = DeviceArray<float>(model.alibi_slopes());
  final_norm_ = upload(model.final_norm());
  final_norm_bias_ = upload(model.globals().final_norm_bias);
  for (int l = 0; l < c.n_layers; ++l) {
    const DecoderLayer& L = model.layers()[size_t(l)];
    const std::string p = "layer " + std::to_string(l) + " ";
    CudaDecoderLayer D;
    D.attn_norm = upload(L.attn_norm);
    D.attn_norm_bias = upload(L.attn_norm_bias);
    D.q_norm = upload(L.q_norm);
    D.k_norm = upload(L.k_norm);
    D.attn_post_norm = upload(L.attn_post_norm);
    D.attn_post_norm_bias = upload(L.attn_post_norm_bias);
    D.ffn_norm = upload(L.ffn_norm);
    D.ffn_norm_bias = upload(L.ffn_norm_bias);
    D.ffn_post_norm = upload(L.ffn_post_norm);
    D.ffn_post_norm_bias = upload(L.ffn_post_norm_bias);
    D.q_proj = upload(L.q_proj, p + "q_proj");
    D.k_proj = upload(L.k_proj, p + "k_proj");
    D.v_proj = upload(L.v_proj, p + "v_proj");
    D.o_proj = upload(L.o_proj, p + "o_proj");
    D.gate_proj = upload(L.gate_proj, p + "gate_proj");
    D.up_proj = upload(L.up_proj, p + "up_proj");
    D.down_proj = upload(L.down_proj, p + "down_proj");
    D.router = upload(L.router, p + "router");
    for (size_t e = 0; e < L.experts.size(); ++e) {
      const std::string x = p + "expert " + std::to_string(e) + " ";
      CudaExpert E;
      E.gate_proj = upload(L.experts[e].gate_proj, x + "gate_proj");
      E.up_proj = upload(L.experts[e].up_proj, x + "up_proj");
      E.down_proj = upload(L.experts[e].down_proj, x + "down_proj");
      D.experts.push_back(std::move(E));
    }
    layers_.push_back(std::move(D));
  }
  lm_head_ = cuda::upload_linear(model.lm_head(), "the LM head");
}

void CudaDecoder::reserve(int64_t n) {
  if (n <= reserved_) return;
  const ModelConfig& c = config_;
  const size_t N = size_t(n), d = size_t(c.dim), qw = size_t(c.n_heads) * size_t(c.head_dim),
               kvw = size_t(c.n_kv_heads) * size_t(c.head_dim), hid = size_t(c.hidden_dim);
  x_ = DeviceArray<float>(N * d);
  xn_ = DeviceArray<float>(N * d);
  q_ = DeviceArray<float>(N * qw);
  k_ = DeviceArray<float>(N * kvw);
  v_ = DeviceArray<float>(N * kvw);
  att_ = DeviceArray<float>(N * qw);
  proj_ = DeviceArray<float>(N * d);
  proj2_ = DeviceArray<float>(N * d);
  gate_ = DeviceArray<float>(N * hid);
  up_ = DeviceArray<float>(N * hid);
  if (c.spec.n_experts > 0) {
    router_ = DeviceArray<float>(N * size_t(c.spec.n_experts));
    moe_x_ = DeviceArray<float>(N * d);
    moe_out_ = DeviceArray<float>(N * d);
    moe_w_ = DeviceArray<float>(N);
    moe_rows_ = DeviceArray<int32_t>(N);
  }
  logits_ = DeviceArray<float>(N * size_t(c.vocab_size));
  positions_ = DeviceArray<int32_t>(N);
  reserved_ = n;
}

void CudaDecoder::forward(const int32_t* tokens, int64_t n, CudaKVCache& cache, float* logits, LogitsFor which) {
  const ModelConfig& c = config_;
  if (n <= 0) return;
  const int64_t p0 = cache.length();
  if (p0 + n > cache.capacity())
    throw std::length_error("KV cache full: " + std::to_string(p0) + " + " + std::to_string(n) + " positions exceed capacity " +
                            std::to_string(cache.capacity()));
  const int64_t d = c.dim;
  // The layer-0 input on the host (token ids and learned positions are checked there), then uploaded.
  host_x_.resize(static_cast<size_t>(n * d));
  host_->embed(tokens, n, host_x_.data(), p0);
  reserve(n);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), static_cast<int32_t>(p0));
  positions_.upload(pos.data(), size_t(n));
  x_.upload(host_x_.data(), size_t(n * d));

  // All ops run on the legacy default stream, in order; the final download synchronizes.
  float* x = x_.data();
  CudaLayerBackend be{*this, cache, c};
  for (int l = 0; l < c.n_layers; ++l) run_decoder_layer(c, l, layers_[size_t(l)], be, x, n);
  cache.advance(n);
  if (which == LogitsFor::None) {
    cuda_synchronize(Stream{}, "CUDA runner forward");
    return;
  }
  const int64_t first = which == LogitsFor::AllTokens ? 0 : n - 1;
  const int64_t rows = n - first;
  cuda::norm(c.spec.norm, x + first * d, final_norm_.data(), or_null(final_norm_bias_), xn_.data(), rows, c.dim, c.norm_eps);
  lm_head_->forward(xn_.data(), rows, logits_.data(), Stream{});
  logits_.download(logits, size_t(rows) * size_t(c.vocab_size));
}

}  // namespace sq
