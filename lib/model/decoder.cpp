#include "model/decoder.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "core/rope_frequencies.h"
#include "model/w8a8_linear.h"
#include "ops/ops.h"

namespace sq {

namespace {
/// Query rows handled per attention task; bounds the score buffer to kQueryBlock × context floats.
constexpr int64_t kQueryBlock = 64;

void ensure(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

/// Runs linears that read the same input x [n, in] into their outputs. When all of them are W8A8
/// linears that quantize their input identically, x is quantized once (straight into the INT8
/// kernel's layout) and shared; otherwise each linear runs on its own.
void run_sharing_input(std::initializer_list<std::pair<const Linear*, float*>> linears, const float* x, int64_t n) {
  const W8A8Linear* first = dynamic_cast<const W8A8Linear*>(linears.begin()->first);
  bool shared = first != nullptr;
  for (const auto& [lin, y] : linears) {
    const auto* q = dynamic_cast<const W8A8Linear*>(lin);
    shared = shared && q && q->shares_input_quantization(*first);
  }
  if (!shared) {
    for (const auto& [lin, y] : linears) lin->forward(x, n, y);
    return;
  }
  static thread_local W8A8Linear::QuantizedInput qx;
  first->quantize_input_u8(x, n, qx);
  for (const auto& [lin, y] : linears) static_cast<const W8A8Linear*>(lin)->forward_prequantized(qx, y);
}
}  // namespace

Decoder::Decoder(ModelConfig config, Tensor embed, std::vector<DecoderLayer> layers, Tensor final_norm,
                       std::unique_ptr<Linear> lm_head)
    : config_(std::move(config)),
      rope_inv_freq_(rope_inv_freq(config_)),
      embed_(std::move(embed)),
      layers_(std::move(layers)),
      final_norm_(std::move(final_norm)),
      lm_head_(std::move(lm_head)) {}

Decoder Decoder::from_checkpoint(const Checkpoint& ck) {
  const ModelConfig& c = ck.config;
  const int64_t d = c.dim, q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim, h = c.hidden_dim;
  auto dense = [&](const std::string& name, std::vector<int64_t> shape, const std::string& bias = "") {
    Tensor b;
    if (!bias.empty()) b = ck.get(bias, {shape[0]});
    return std::make_unique<DenseLinear>(ck.get(name, shape), b);
  };
  std::vector<DecoderLayer> layers(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = names::layer(l);
    const std::string a = p + "self_attn.";
    DecoderLayer& L = layers[static_cast<size_t>(l)];
    L.attn_norm = ck.get(p + "input_layernorm.weight", {d});
    L.q_proj = dense(a + "q_proj.weight", {q, d}, c.qkv_bias ? a + "q_proj.bias" : "");
    L.k_proj = dense(a + "k_proj.weight", {kv, d}, c.qkv_bias ? a + "k_proj.bias" : "");
    L.v_proj = dense(a + "v_proj.weight", {kv, d}, c.qkv_bias ? a + "v_proj.bias" : "");
    L.o_proj = dense(a + "o_proj.weight", {d, q});
    L.ffn_norm = ck.get(p + "post_attention_layernorm.weight", {d});
    L.gate_proj = dense(p + "mlp.gate_proj.weight", {h, d});
    L.up_proj = dense(p + "mlp.up_proj.weight", {h, d});
    L.down_proj = dense(p + "mlp.down_proj.weight", {d, h});
  }
  Tensor embed = ck.get(names::kEmbed, {c.vocab_size, d});
  auto head = std::make_unique<DenseLinear>(c.tied_embeddings ? embed : ck.get(names::kLmHead, {c.vocab_size, d}));
  return Decoder(c, embed, std::move(layers), ck.get(names::kFinalNorm, {d}), std::move(head));
}

void Decoder::set_quantized_embedding(std::vector<int8_t> q, std::vector<float> scales) {
  const size_t v = static_cast<size_t>(config_.vocab_size), d = static_cast<size_t>(config_.dim);
  if (q.size() != v * d || scales.size() != v)
    throw std::invalid_argument("set_quantized_embedding: expected " + std::to_string(v) + " x " + std::to_string(d) +
                                " values and " + std::to_string(v) + " scales");
  embed_q_ = std::move(q);
  embed_scales_ = std::move(scales);
  embed_ = Tensor();
}

void Decoder::prepare(Workspace& ws, int64_t n, int64_t p0) const {
  const ModelConfig& c = config_;
  const int64_t d = c.dim, qw = int64_t(c.n_heads) * c.head_dim, kvw = int64_t(c.n_kv_heads) * c.head_dim, hid = c.hidden_dim;
  ensure(ws.x, n * d);
  ensure(ws.xn, n * d);
  ensure(ws.q, n * qw);
  ensure(ws.k, n * kvw);
  ensure(ws.v, n * kvw);
  ensure(ws.att, n * qw);
  ensure(ws.proj, n * d);
  ensure(ws.gate, n * hid);
  ensure(ws.up, n * hid);
  ws.positions.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) ws.positions[static_cast<size_t>(t)] = static_cast<int32_t>(p0 + t);
}

void Decoder::embed(const int32_t* tokens, int64_t n, float* x) const {
  const ModelConfig& c = config_;
  const int64_t d = c.dim;
  for (int64_t t = 0; t < n; ++t) {
    const int32_t tok = tokens[t];
    if (tok < 0 || tok >= c.vocab_size)
      throw std::out_of_range("token id " + std::to_string(tok) + " outside the vocabulary of " + std::to_string(c.vocab_size));
    if (embed_q_.empty()) {
      std::memcpy(x + t * d, embed_.data() + int64_t(tok) * d, static_cast<size_t>(d) * sizeof(float));
    } else {
      const int8_t* row = embed_q_.data() + int64_t(tok) * d;
      const float scale = embed_scales_[static_cast<size_t>(tok)];
      for (int64_t j = 0; j < d; ++j) x[t * d + j] = static_cast<float>(row[j]) * scale;
    }
  }
}

void Decoder::forward(const int32_t* tokens, int64_t n, KVCache& cache, Workspace& ws, float* logits,
                         LogitsFor which, ActivationObserver* obs) const {
  const ModelConfig& c = config_;
  const int64_t d = c.dim;
  const int64_t p0 = cache.length();
  if (n <= 0) return;
  if (p0 + n > cache.capacity())
    throw std::length_error("KV cache full: " + std::to_string(p0) + " + " + std::to_string(n) + " positions exceed capacity " +
                            std::to_string(cache.capacity()));
  prepare(ws, n, p0);
  float* x = ws.x.data();  // x[n, dim] = embedding rows of the tokens
  embed(tokens, n, x);
  for (int l = 0; l < c.n_layers; ++l) run_layer(l, layers_[static_cast<size_t>(l)], x, n, cache, ws, obs);
  cache.advance(n);

  if (which == LogitsFor::None) return;
  const int64_t first = which == LogitsFor::AllTokens ? 0 : n - 1;
  const int64_t rows = n - first;
  float* xn = ws.xn.data();
  ops::rms_norm(x + first * d, final_norm_.data(), xn, rows, static_cast<int>(d), c.norm_eps);
  lm_head_->forward(xn, rows, logits);  // logits[rows, vocab]
}

void Decoder::forward_layer(int l, const DecoderLayer& L, float* x, int64_t n, KVCache& cache, Workspace& ws,
                               ActivationObserver* obs) const {
  if (l < 0 || l >= config_.n_layers) throw std::out_of_range("layer " + std::to_string(l) + " out of range");
  const int64_t p0 = cache.length();
  if (n <= 0) return;
  if (p0 + n > cache.capacity())
    throw std::length_error("KV cache full: " + std::to_string(p0) + " + " + std::to_string(n) + " positions exceed capacity " +
                            std::to_string(cache.capacity()));
  prepare(ws, n, p0);
  run_layer(l, L, x, n, cache, ws, obs);
}

void Decoder::run_layer(int l, const DecoderLayer& L, float* x, int64_t n, KVCache& cache, Workspace& ws,
                           ActivationObserver* obs) const {
  const ModelConfig& c = config_;
  const int64_t d = c.dim, hd = c.head_dim, qw = int64_t(c.n_heads) * hd, kvw = int64_t(c.n_kv_heads) * hd,
                hid = c.hidden_dim;
  const int64_t p0 = cache.length();
  float* xn = ws.xn.data();
  // --- attention block: x += o_proj(attention(rope(q), rope(k), v)) on RMSNorm(x) ---
  ops::rms_norm(x, L.attn_norm.data(), xn, n, static_cast<int>(d), c.norm_eps);
  // q[n, n_heads*hd], k[n, n_kv*hd], v[n, n_kv*hd]
  run_sharing_input({{L.q_proj.get(), ws.q.data()}, {L.k_proj.get(), ws.k.data()}, {L.v_proj.get(), ws.v.data()}}, xn, n);
  if (obs) {
    obs->on_linear_input(l, ActivationSite::AttnInput, xn, n, d);
    obs->on_linear_output(l, Projection::Q, ws.q.data(), n, qw);
    obs->on_linear_output(l, Projection::K, ws.k.data(), n, kvw);
    obs->on_linear_output(l, Projection::V, ws.v.data(), n, kvw);
    obs->on_kv(l, ws.k.data(), ws.v.data(), n, kvw);  // keys still pre-RoPE here
  }
  // Queries (and post-RoPE keys) are rotated at their cache positions p0 … p0+n−1; the cache
  // stores the new rows (quantizing them in its format) and returns every row's key rotated at its
  // cache position, dequantized, with the values (runtime/kv_cache.h).
  ops::rope(ws.q.data(), ws.positions.data(), n, c.n_heads, static_cast<int>(hd), rope_inv_freq_.data(), c.rope_layout);
  if (!cache.keys_pre_rope())
    ops::rope(ws.k.data(), ws.positions.data(), n, c.n_kv_heads, static_cast<int>(hd), rope_inv_freq_.data(), c.rope_layout);
  cache.write(l, ws.k.data(), ws.v.data(), n);
  // Decode steps over a nuq cache attend over the packed rows directly (runtime/kv_decode_attention.h);
  // every other case (prefill, FP32/int caches) dequantizes the rows and runs sgemm attention.
  const bool fused = n == 1 && ws.fused_decode_attention && nuq_decode_attention(cache, l, p0 + 1, ws.q.data(), c.n_heads, ws.att.data(),
                                                    ws.kv_decode, ws.attention_mass);
  if (!fused) {
    const KVCache::View kv = cache.read(l, p0 + n, ws.kbuf, ws.vbuf);
    attention(ws.q.data(), kv.keys, kv.values, n, p0, ws.att.data(), ws);  // att[n, n_heads*hd]
  }
  L.o_proj->forward(ws.att.data(), n, ws.proj.data());
  if (obs) {
    obs->on_linear_input(l, ActivationSite::AttnOutput, ws.att.data(), n, qw);
    obs->on_linear_output(l, Projection::O, ws.proj.data(), n, d);
  }
  ops::add_inplace(x, ws.proj.data(), n * d);

  // --- FFN block: x += down(silu(gate(xn)) * up(xn)) on RMSNorm(x) ---
  ops::rms_norm(x, L.ffn_norm.data(), xn, n, static_cast<int>(d), c.norm_eps);
  run_sharing_input({{L.gate_proj.get(), ws.gate.data()}, {L.up_proj.get(), ws.up.data()}}, xn, n);  // [n, hidden] each
  if (obs) {
    obs->on_linear_input(l, ActivationSite::FfnInput, xn, n, d);
    obs->on_linear_output(l, Projection::Gate, ws.gate.data(), n, hid);
    obs->on_linear_output(l, Projection::Up, ws.up.data(), n, hid);
  }
  ops::swiglu(ws.gate.data(), ws.up.data(), n * hid);
  L.down_proj->forward(ws.gate.data(), n, ws.proj.data());  // [n, dim]
  if (obs) {
    obs->on_linear_input(l, ActivationSite::FfnHidden, ws.gate.data(), n, hid);
    obs->on_linear_output(l, Projection::Down, ws.proj.data(), n, d);
  }
  ops::add_inplace(x, ws.proj.data(), n * d);
}

void Decoder::attention(const float* q, const float* keys, const float* values, int64_t n, int64_t p0, float* out,
                           Workspace& ws) const {
  // Causal grouped-query attention for n new queries at positions p0..p0+n-1 over cache rows
  // 0..p0+n-1. Query head h reads KV head h / (n_heads / n_kv_heads).
  //   S[i, j] = q_h[i] · k_g[j] / sqrt(hd)   (j ≤ p0 + i)
  //   out_h[i] = softmax(S[i]) · V_g
  const ModelConfig& c = config_;
  const int64_t hd = c.head_dim, qw = int64_t(c.n_heads) * hd, kvw = int64_t(c.n_kv_heads) * hd;
  const int group = c.n_heads / c.n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t n_blocks = (n + kQueryBlock - 1) / kQueryBlock;
  const int64_t tasks = int64_t(c.n_heads) * n_blocks;
  // Parallel over (head, query block) only when there is enough work to pay for waking threads
  // (~2^20 multiply-adds); decode steps of small models run on the calling thread.
  const double work = double(n) * double(p0 + n) * double(hd) * c.n_heads;
  std::vector<double>* mass = ws.attention_mass;
  const int threads = (omp_in_parallel() || work < double(1 << 20) || mass) ? 1 : omp_get_max_threads();
  if (mass && static_cast<int64_t>(mass->size()) < p0 + n) mass->resize(static_cast<size_t>(p0 + n), 0.0);
  if (static_cast<int>(ws.scores.size()) < threads) ws.scores.resize(static_cast<size_t>(threads));

#pragma omp parallel for schedule(dynamic) num_threads(threads) if (threads > 1 && tasks > 1)
  for (int64_t task = 0; task < tasks; ++task) {
    const int h = static_cast<int>(task / n_blocks);
    const int64_t r0 = (task % n_blocks) * kQueryBlock;
    const int64_t rows = std::min(kQueryBlock, n - r0);
    const int64_t n_keys = p0 + r0 + rows;  // keys visible to the last row of this block
    std::vector<float>& S = ws.scores[static_cast<size_t>(omp_get_thread_num())];
    ensure(S, rows * n_keys);
    const float* Qh = q + r0 * qw + h * hd;
    const float* Kg = keys + (h / group) * hd;
    const float* Vg = values + (h / group) * hd;
    // S[rows, n_keys] = scale · Q_h[rows, hd] · K_g[n_keys, hd]ᵀ
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(rows), static_cast<blasint>(n_keys),
                static_cast<blasint>(hd), scale, Qh, static_cast<blasint>(qw), Kg, static_cast<blasint>(kvw), 0.0f, S.data(),
                static_cast<blasint>(n_keys));
    for (int64_t i = 0; i < rows; ++i) {
      float* row = S.data() + i * n_keys;
      const int64_t visible = p0 + r0 + i + 1;  // causal mask
      ops::softmax_row(row, static_cast<int>(visible));
      std::fill(row + visible, row + n_keys, 0.0f);
      if (mass)
        for (int64_t j = 0; j < visible; ++j) (*mass)[static_cast<size_t>(j)] += row[j];
    }
    // out_h[rows, hd] = P[rows, n_keys] · V_g[n_keys, hd]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(rows), static_cast<blasint>(hd),
                static_cast<blasint>(n_keys), 1.0f, S.data(), static_cast<blasint>(n_keys), Vg, static_cast<blasint>(kvw), 0.0f,
                out + r0 * qw + h * hd, static_cast<blasint>(qw));
  }
}

}  // namespace sq
