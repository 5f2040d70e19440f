#include "cuda/cuda_llama_model.h"

#include <numeric>
#include <stdexcept>
#include <string>

#include "core/error.h"
#include "core/rope_frequencies.h"
#include "cuda/cuda_ops.h"

namespace sq {

CudaLlamaModel::CudaLlamaModel(const Decoder& model) : config_(model.config()), rope_inv_freq_(rope_inv_freq(config_)) {
  config_.require_llama_structure("The CUDA runner");
  require_cuda("CUDA runner");
  const ModelConfig& c = config_;
  // The FP32 embedding table, dequantized when stored INT8 (Decoder::embed does either).
  std::vector<int32_t> all(size_t(c.vocab_size));
  std::iota(all.begin(), all.end(), 0);
  std::vector<float> table(size_t(c.vocab_size) * size_t(c.dim));
  model.embed(all.data(), c.vocab_size, table.data());
  embed_ = DeviceArray<float>(table);
  final_norm_ = DeviceArray<float>(model.final_norm().data(), size_t(c.dim));
  for (int l = 0; l < c.n_layers; ++l) {
    const DecoderLayer& L = model.layers()[size_t(l)];
    const std::string p = "layer " + std::to_string(l) + " ";
    Layer D;
    D.attn_norm = DeviceArray<float>(L.attn_norm.data(), size_t(c.dim));
    D.ffn_norm = DeviceArray<float>(L.ffn_norm.data(), size_t(c.dim));
    D.q = cuda::upload_linear(*L.q_proj, p + "q_proj");
    D.k = cuda::upload_linear(*L.k_proj, p + "k_proj");
    D.v = cuda::upload_linear(*L.v_proj, p + "v_proj");
    D.o = cuda::upload_linear(*L.o_proj, p + "o_proj");
    D.gate = cuda::upload_linear(*L.gate_proj, p + "gate_proj");
    D.up = cuda::upload_linear(*L.up_proj, p + "up_proj");
    D.down = cuda::upload_linear(*L.down_proj, p + "down_proj");
    layers_.push_back(std::move(D));
  }
  lm_head_ = cuda::upload_linear(model.lm_head(), "the LM head");
}

void CudaLlamaModel::reserve(int64_t n) {
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
  gate_ = DeviceArray<float>(N * hid);
  up_ = DeviceArray<float>(N * hid);
  logits_ = DeviceArray<float>(N * size_t(c.vocab_size));
  tokens_ = DeviceArray<int32_t>(N);
  positions_ = DeviceArray<int32_t>(N);
  reserved_ = n;
}

void CudaLlamaModel::forward(const int32_t* tokens, int64_t n, CudaKVCache& cache, float* logits, LogitsFor which) {
  const ModelConfig& c = config_;
  if (n <= 0) return;
  const int64_t p0 = cache.length();
  if (p0 + n > cache.capacity())
    throw std::length_error("KV cache full: " + std::to_string(p0) + " + " + std::to_string(n) + " positions exceed capacity " +
                            std::to_string(cache.capacity()));
  for (int64_t t = 0; t < n; ++t)
    if (tokens[t] < 0 || tokens[t] >= c.vocab_size)
      throw std::out_of_range("token id " + std::to_string(tokens[t]) + " outside the vocabulary of " +
                              std::to_string(c.vocab_size));
  reserve(n);
  const int64_t d = c.dim, hid = c.hidden_dim;
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), static_cast<int32_t>(p0));
  tokens_.upload(tokens, size_t(n));
  positions_.upload(pos.data(), size_t(n));

  // All ops run on the legacy default stream, in order; the final download synchronizes.
  float* x = x_.data();
  float* xn = xn_.data();
  cuda::embedding(embed_.data(), c.vocab_size, c.dim, tokens_.data(), n, x);
  for (int l = 0; l < c.n_layers; ++l) {
    const Layer& L = layers_[size_t(l)];
    // Attention block: x += o_proj(attention(rope(q), rope(k), v)) on RMSNorm(x).
    cuda::rms_norm(x, L.attn_norm.data(), xn, n, c.dim, c.norm_eps);
    L.q->forward(xn, n, q_.data());
    L.k->forward(xn, n, k_.data());
    L.v->forward(xn, n, v_.data());
    cuda::rope(q_.data(), positions_.data(), n, c.n_heads, c.head_dim, rope_inv_freq_.data(), c.rope_layout);
    // The cache stores the keys (rotating them first unless its format keeps them pre-RoPE) and
    // attends over its rows in its storage format (cuda/cuda_kv_cache.h).
    cache.append(l, k_.data(), v_.data(), n, positions_.data());
    cache.attend(l, q_.data(), n, att_.data());
    L.o->forward(att_.data(), n, proj_.data());
    cuda::add_inplace(x, proj_.data(), n * d);
    // FFN block: x += down(silu(gate(xn)) * up(xn)) on RMSNorm(x).
    cuda::rms_norm(x, L.ffn_norm.data(), xn, n, c.dim, c.norm_eps);
    L.gate->forward(xn, n, gate_.data());
    L.up->forward(xn, n, up_.data());
    cuda::swiglu(gate_.data(), up_.data(), n * hid);
    L.down->forward(gate_.data(), n, proj_.data());
    cuda::add_inplace(x, proj_.data(), n * d);
  }
  cache.advance(n);
  if (which == LogitsFor::None) {
    cuda_synchronize(Stream{}, "CUDA runner forward");
    return;
  }
  const int64_t first = which == LogitsFor::AllTokens ? 0 : n - 1;
  const int64_t rows = n - first;
  cuda::rms_norm(x + first * d, final_norm_.data(), xn, rows, c.dim, c.norm_eps);
  lm_head_->forward(xn, rows, logits_.data());
  logits_.download(logits, size_t(rows) * size_t(c.vocab_size));
}

}  // namespace sq
