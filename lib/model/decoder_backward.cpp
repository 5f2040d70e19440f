#include "model/decoder_backward.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "core/rope_frequencies.h"

namespace sq {

namespace {

/// Query rows per attention block: bounds the score buffers to kQueryBlock × n values per thread.
constexpr int64_t kQueryBlock = 64;

// ---- BLAS ------------------------------------------------------------------------------------

/// C[m, n] = alpha · op(A) · op(B) + beta · C, row-major; op(X) = Xᵀ when trans_X.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, A, static_cast<blasint>(lda), B,
              static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* A, int64_t lda, const double* B,
          int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, A, static_cast<blasint>(lda), B,
              static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
}

}  // namespace

// ---- weights -----------------------------------------------------------------------------------

/// The model's FP32 weights seen as T: float views in place, double widened copies.
template <typename T>
struct DecoderKVBackward<T>::Weights {
  /// A read-only array of T bound to FP32 data.
  struct Vec {
    std::vector<T> owned;
    const T* data = nullptr;
    void bind(const float* p, int64_t count) {
      if constexpr (std::is_same_v<T, float>) {
        data = p;
      } else {
        owned.assign(p, p + count);
        data = owned.data();
      }
    }
  };
  /// A projection y = x·Wᵀ + b: W [out, in] row-major, b [out] or null.
  struct Proj {
    Vec w, b;
    int64_t out = 0, in = 0;
  };
  struct Layer {
    Vec attn_norm, ffn_norm;  // [dim]
    Proj q, k, v, o, gate, up, down;
  };
  std::vector<Layer> layers;
  Vec embed;       // [vocab, dim]
  Vec final_norm;  // [dim]
  Proj head;       // [vocab, dim]
};

namespace {

/// The DenseLinear behind `lin`, or UnsupportedError naming the projection.
const DenseLinear& dense(const Linear& lin, const std::string& name) {
  const auto* d = dynamic_cast<const DenseLinear*>(&lin);
  if (!d)
    throw UnsupportedError("K/V gradients (Fisher information) need the FP32 model, but " + name + " is a " +
                           lin.format() + " linear; calibrate the original checkpoint");
  return *d;
}

// ---- forward ops ---------------------------------------------------------------------------------

/// y[n, out] = x[n, in] · Wᵀ + b   (W [out, in] row-major, b [out] or null)
template <typename T, typename P>
void linear_forward(const P& p, const T* x, int64_t n, T* y) {
  gemm(false, true, n, p.out, p.in, T(1), x, p.in, p.w.data, p.in, T(0), y, p.out);
  if (p.b.data)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < p.out; ++j) y[t * p.out + j] += p.b.data[j];
}

/// RMSNorm: y[t, j] = x[t, j] · r[t] · w[j] with r[t] = 1 / sqrt(mean_j x[t, j]² + eps); saves r [n].
/// x, y: [n, d]. (Same arithmetic order as ops::rms_norm.)
template <typename T>
void rms_norm_forward(const T* x, const T* w, T* y, T* r, int64_t n, int64_t d, T eps) {
  for (int64_t t = 0; t < n; ++t) {
    const T* xr = x + t * d;
    T ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += xr[j] * xr[j];
    r[t] = T(1) / std::sqrt(ss / static_cast<T>(d) + eps);
    for (int64_t j = 0; j < d; ++j) y[t * d + j] = xr[j] * r[t] * w[j];
  }
}

/// RoPE (Su et al. 2021) on x [n, heads·hd] at positions 0 … n−1, in place: pair i of every head
/// (channels (2i, 2i+1) interleaved, (i, i+hd/2) half-split) is rotated by sign · t·inv_freq[i]
/// (inv_freq [hd/2] = rope_inv_freq<T> of the model config: θ and RoPE scaling).
/// sign = +1 is the forward rotation; sign = −1 applies its transpose (= inverse), which is the
/// backward map dx = Rᵀ·dy of y = R·x. (Same angle arithmetic as ops::rope in FP32.)
template <typename T>
void rope(T* x, int64_t n, int heads, int hd, const std::vector<T>& inv_freq, RopeLayout layout, int sign) {
  const int half = hd / 2;
  const int64_t width = int64_t(heads) * hd;
  for (int64_t t = 0; t < n; ++t) {
    T* row = x + t * width;
    for (int i = 0; i < half; ++i) {
      const T angle = static_cast<T>(t) * inv_freq[static_cast<size_t>(i)];
      const T c = std::cos(angle), s = static_cast<T>(sign) * std::sin(angle);
      const int a = layout == RopeLayout::Interleaved ? 2 * i : i;
      const int b = layout == RopeLayout::Interleaved ? 2 * i + 1 : i + half;
      for (int h = 0; h < heads; ++h) {
        T* v = row + int64_t(h) * hd;
        const T x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
    }
  }
}

/// SwiGLU (Shazeer 2020): h[i] = silu(g[i]) · u[i] = g/(1 + e^−g) · u; all [count].
template <typename T>
void swiglu_forward(const T* g, const T* u, T* h, int64_t count) {
  for (int64_t i = 0; i < count; ++i) h[i] = g[i] / (T(1) + std::exp(-g[i])) * u[i];
}

/// Causal attention probabilities of query rows r0 … r0+rows−1 of one head over keys 0 … r0+rows−1:
/// P[i, j] = softmax_j(scale · q[r0+i] · k[j]) for j ≤ r0+i, 0 beyond (causal mask).
/// q rows have stride ldq, k rows stride ldk; P: [rows, r0+rows].
template <typename T>
void attention_probs(const T* q, int64_t ldq, const T* k, int64_t ldk, int64_t hd, int64_t r0, int64_t rows, T scale,
                     T* P) {
  const int64_t n_keys = r0 + rows;
  gemm(false, true, rows, n_keys, hd, scale, q + r0 * ldq, ldq, k, ldk, T(0), P, n_keys);  // S = scale·Q·Kᵀ
  for (int64_t i = 0; i < rows; ++i) {
    T* row = P + i * n_keys;
    const int64_t visible = r0 + i + 1;
    const T m = *std::max_element(row, row + visible);
    T sum = 0;
    for (int64_t j = 0; j < visible; ++j) sum += (row[j] = std::exp(row[j] - m));
    for (int64_t j = 0; j < visible; ++j) row[j] /= sum;
    std::fill(row + visible, row + n_keys, T(0));
  }
}

/// Grouped-query causal attention at positions 0 … n−1: q [n, n_heads·hd], k, v [n, n_kv·hd]
/// (RoPE already applied to q and k), out [n, n_heads·hd]; query head h reads KV head h / group.
///   out_h = softmax(scale · Q_h·K_gᵀ + causal mask) · V_g,   scale = 1/√hd
template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* out, int64_t n, int n_heads, int n_kv, int64_t hd) {
  const int64_t qw = int64_t(n_heads) * hd, kvw = int64_t(n_kv) * hd;
  const int group = n_heads / n_kv;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
#pragma omp parallel for schedule(dynamic) if (!omp_in_parallel() && n_kv > 1 && n >= 256)
  for (int g = 0; g < n_kv; ++g) {
    std::vector<T> P;
    for (int h = g * group; h < (g + 1) * group; ++h)
      for (int64_t r0 = 0; r0 < n; r0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, n - r0), n_keys = r0 + rows;
        P.resize(static_cast<size_t>(rows * n_keys));
        attention_probs(q + h * hd, qw, k + g * hd, kvw, hd, r0, rows, scale, P.data());
        // out_h[rows, hd] = P[rows, n_keys] · V_g[n_keys, hd]
        gemm(false, false, rows, hd, n_keys, T(1), P.data(), n_keys, v + g * hd, kvw, T(0), out + r0 * qw + h * hd, qw);
      }
  }
}

// ---- backward ops (each takes the output gradient and returns / accumulates the input gradient) ----

/// dx[n, in] = dy[n, out] · W  (+= when accumulate); y = x·Wᵀ + b (the bias has no input gradient).
template <typename T, typename P>
void linear_backward(const P& p, const T* dy, int64_t n, T* dx, bool accumulate) {
  gemm(false, false, n, p.in, p.out, T(1), dy, p.out, p.w.data, p.in, accumulate ? T(1) : T(0), dx, p.in);
}

/// RMSNorm backward, accumulated into dx [n, d]: with y_j = x_j·r·w_j and r = (mean x² + eps)^(−1/2),
///   ∂L/∂x_j = r·w_j·dy_j − (r³/d) · x_j · Σ_k dy_k·w_k·x_k.
/// x, dy: [n, d]; r: [n] saved by rms_norm_forward.
template <typename T>
void rms_norm_backward(const T* x, const T* r, const T* w, const T* dy, T* dx, int64_t n, int64_t d) {
  for (int64_t t = 0; t < n; ++t) {
    const T* xr = x + t * d;
    const T* g = dy + t * d;
    T dot = 0;
    for (int64_t k = 0; k < d; ++k) dot += g[k] * w[k] * xr[k];
    const T rt = r[t], c = rt * rt * rt / static_cast<T>(d) * dot;
    for (int64_t j = 0; j < d; ++j) dx[t * d + j] += rt * w[j] * g[j] - c * xr[j];
  }
}

/// SwiGLU backward: with h = silu(g)·u, σ = 1/(1 + e^−g):
///   dg = dh · u · σ · (1 + g·(1 − σ)),   du = dh · g · σ.   All [count]; dg, du overwritten.
template <typename T>
void swiglu_backward(const T* g, const T* u, const T* dh, T* dg, T* du, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const T s = T(1) / (T(1) + std::exp(-g[i]));
    dg[i] = dh[i] * u[i] * s * (T(1) + g[i] * (T(1) - s));
    du[i] = dh[i] * g[i] * s;
  }
}

/// Attention backward (shapes as attention_forward; dout [n, n_heads·hd]); dq [n, n_heads·hd],
/// dk, dv [n, n_kv·hd] overwritten, all with respect to the post-RoPE q and k. Per query head h of
/// KV group g, recomputing P from q and k (nothing n² is saved by the forward):
///   dP = dO_h·V_gᵀ;  dV_g += Pᵀ·dO_h;  dS = P ⊙ (dP − rowsum(P ⊙ dP));
///   dQ_h = scale·dS·K_g;  dK_g += scale·dSᵀ·Q_h.
/// The heads of one group accumulate into the same dK_g, dV_g, so work is split over KV groups
/// (fixed accumulation order: deterministic).
template <typename T>
void attention_backward(const T* q, const T* k, const T* v, const T* dout, T* dq, T* dk, T* dv, int64_t n, int n_heads,
                        int n_kv, int64_t hd) {
  const int64_t qw = int64_t(n_heads) * hd, kvw = int64_t(n_kv) * hd;
  const int group = n_heads / n_kv;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  std::fill(dk, dk + n * kvw, T(0));
  std::fill(dv, dv + n * kvw, T(0));
#pragma omp parallel for schedule(dynamic) if (!omp_in_parallel() && n_kv > 1 && n >= 256)
  for (int g = 0; g < n_kv; ++g) {
    std::vector<T> P, dP;
    for (int h = g * group; h < (g + 1) * group; ++h)
      for (int64_t r0 = 0; r0 < n; r0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, n - r0), n_keys = r0 + rows;
        P.resize(static_cast<size_t>(rows * n_keys));
        dP.resize(static_cast<size_t>(rows * n_keys));
        attention_probs(q + h * hd, qw, k + g * hd, kvw, hd, r0, rows, scale, P.data());
        const T* dO = dout + r0 * qw + h * hd;  // [rows, hd], stride qw
        // dP[rows, n_keys] = dO[rows, hd] · V_g[n_keys, hd]ᵀ
        gemm(false, true, rows, n_keys, hd, T(1), dO, qw, v + g * hd, kvw, T(0), dP.data(), n_keys);
        // dV_g[n_keys, hd] += P[rows, n_keys]ᵀ · dO[rows, hd]
        gemm(true, false, n_keys, hd, rows, T(1), P.data(), n_keys, dO, qw, T(1), dv + g * hd, kvw);
        // dS = P ⊙ (dP − Σ_j P⊙dP), in place of dP (masked entries have P = 0, hence dS = 0)
        for (int64_t i = 0; i < rows; ++i) {
          const T* p = P.data() + i * n_keys;
          T* ds = dP.data() + i * n_keys;
          T dot = 0;
          for (int64_t j = 0; j < n_keys; ++j) dot += p[j] * ds[j];
          for (int64_t j = 0; j < n_keys; ++j) ds[j] = p[j] * (ds[j] - dot);
        }
        // dQ_h[rows, hd] = scale · dS[rows, n_keys] · K_g[n_keys, hd]
        gemm(false, false, rows, hd, n_keys, scale, dP.data(), n_keys, k + g * hd, kvw, T(0), dq + r0 * qw + h * hd, qw);
        // dK_g[n_keys, hd] += scale · dS[rows, n_keys]ᵀ · Q_h[rows, hd]
        gemm(true, false, n_keys, hd, rows, scale, dP.data(), n_keys, q + r0 * qw + h * hd, qw, T(1), dk + g * hd, kvw);
      }
  }
}

}  // namespace

// ---- the tape: activations saved by the forward for the backward --------------------------------

template <typename T>
struct DecoderKVBackward<T>::Tape {
  struct Layer {
    std::vector<T> x_in;      // [n, dim] residual stream entering the layer
    std::vector<T> r_attn;    // [n] attention RMSNorm's 1/rms
    std::vector<T> q;         // [n, n_heads·hd] after RoPE
    std::vector<T> k_pre, k;  // [n, kvw] before / after RoPE
    std::vector<T> v;         // [n, kvw]
    std::vector<T> x_mid;     // [n, dim] residual stream after the attention block
    std::vector<T> r_ffn;     // [n] FFN RMSNorm's 1/rms
    std::vector<T> gate, up;  // [n, hidden] projections before SwiGLU
  };
  int64_t n = 0;
  std::vector<Layer> layers;
  std::vector<T> x_final;  // [n, dim] residual stream after the last layer
  std::vector<T> r_final;  // [n]
  std::vector<T> logits;   // [n, vocab]
  double loss = 0.0;
};

template <typename T>
DecoderKVBackward<T>::DecoderKVBackward(const Decoder& model) : model_(model), w_(std::make_unique<Weights>()) {
  model.config().require_llama_structure("The K/V backward pass (Fisher information)");
  const ModelConfig& c = model.config();
  if (model.embedding().numel() == 0)
    throw UnsupportedError("K/V gradients (Fisher information) need the FP32 model, but its token embedding is stored "
                           "quantized; calibrate the original checkpoint");
  auto bind = [](typename Weights::Proj& p, const DenseLinear& d) {
    p.out = d.out_features();
    p.in = d.in_features();
    p.w.bind(d.weight().data(), p.out * p.in);
    if (d.bias().numel() > 0) p.b.bind(d.bias().data(), p.out);
  };
  w_->layers.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const DecoderLayer& L = model.layers()[static_cast<size_t>(l)];
    typename Weights::Layer& W = w_->layers[static_cast<size_t>(l)];
    const std::string p = "layer " + std::to_string(l) + " ";
    W.attn_norm.bind(L.attn_norm.data(), c.dim);
    W.ffn_norm.bind(L.ffn_norm.data(), c.dim);
    bind(W.q, dense(*L.q_proj, p + "q_proj"));
    bind(W.k, dense(*L.k_proj, p + "k_proj"));
    bind(W.v, dense(*L.v_proj, p + "v_proj"));
    bind(W.o, dense(*L.o_proj, p + "o_proj"));
    bind(W.gate, dense(*L.gate_proj, p + "gate_proj"));
    bind(W.up, dense(*L.up_proj, p + "up_proj"));
    bind(W.down, dense(*L.down_proj, p + "down_proj"));
  }
  w_->embed.bind(model.embedding().data(), int64_t(c.vocab_size) * c.dim);
  w_->final_norm.bind(model.final_norm().data(), c.dim);
  bind(w_->head, dense(model.lm_head(), "the LM head"));
}

template <typename T>
DecoderKVBackward<T>::~DecoderKVBackward() = default;

template <typename T>
void DecoderKVBackward<T>::forward(const int32_t* tokens, int64_t n, const KVPerturbation* pert, Tape& tape) const {
  const ModelConfig& c = model_.config();
  const std::vector<T> inv_freq = rope_inv_freq<T>(c.rope_theta, c.head_dim, c.rope_scaling);
  const int64_t d = c.dim, hd = c.head_dim, qw = int64_t(c.n_heads) * hd, kvw = int64_t(c.n_kv_heads) * hd,
                hid = c.hidden_dim, vocab = c.vocab_size;
  if (n < 2 || n > c.max_seq_len)
    throw std::invalid_argument("K/V gradients need 2 … " + std::to_string(c.max_seq_len) + " tokens, got " +
                                std::to_string(n));
  if (pert && (pert->layer < 0 || pert->layer >= c.n_layers || pert->token < 0 || pert->token >= n ||
               pert->channel < 0 || pert->channel >= kvw))
    throw std::invalid_argument("KVPerturbation outside [" + std::to_string(c.n_layers) + " layers] × [" +
                                std::to_string(n) + " tokens] × [" + std::to_string(kvw) + " channels]");
  tape.n = n;
  tape.layers.resize(static_cast<size_t>(c.n_layers));
  // x[n, dim] = embedding rows of the tokens
  std::vector<T> x(static_cast<size_t>(n * d)), xn(static_cast<size_t>(n * d)), att(static_cast<size_t>(n * qw)),
      proj(static_cast<size_t>(n * d)), h(static_cast<size_t>(n * hid));
  for (int64_t t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= vocab)
      throw std::out_of_range("token id " + std::to_string(tokens[t]) + " outside the vocabulary of " +
                              std::to_string(vocab));
    std::copy_n(w_->embed.data + int64_t(tokens[t]) * d, d, x.begin() + t * d);
  }
  const T eps = static_cast<T>(c.norm_eps);
  for (int l = 0; l < c.n_layers; ++l) {
    const typename Weights::Layer& W = w_->layers[static_cast<size_t>(l)];
    typename Tape::Layer& s = tape.layers[static_cast<size_t>(l)];
    // --- attention block: x_mid = x_in + o_proj(attention(rope(q), rope(k), v)) on RMSNorm(x_in) ---
    s.x_in = x;
    s.r_attn.resize(static_cast<size_t>(n));
    rms_norm_forward(x.data(), W.attn_norm.data, xn.data(), s.r_attn.data(), n, d, eps);
    s.q.resize(static_cast<size_t>(n * qw));
    s.k_pre.resize(static_cast<size_t>(n * kvw));
    s.v.resize(static_cast<size_t>(n * kvw));
    linear_forward(W.q, xn.data(), n, s.q.data());      // [n, qw]
    linear_forward(W.k, xn.data(), n, s.k_pre.data());  // [n, kvw]
    linear_forward(W.v, xn.data(), n, s.v.data());      // [n, kvw]
    if (pert && pert->layer == l) {
      std::vector<T>& a = pert->tensor == KVTensor::Key ? s.k_pre : s.v;
      a[static_cast<size_t>(pert->token * kvw + pert->channel)] += static_cast<T>(pert->delta);
    }
    s.k = s.k_pre;
    rope(s.q.data(), n, c.n_heads, c.head_dim, inv_freq, c.rope_layout, +1);
    rope(s.k.data(), n, c.n_kv_heads, c.head_dim, inv_freq, c.rope_layout, +1);
    attention_forward(s.q.data(), s.k.data(), s.v.data(), att.data(), n, c.n_heads, c.n_kv_heads, hd);  // [n, qw]
    linear_forward(W.o, att.data(), n, proj.data());  // [n, dim]
    for (int64_t i = 0; i < n * d; ++i) x[static_cast<size_t>(i)] += proj[static_cast<size_t>(i)];
    // --- FFN block: x_out = x_mid + down(silu(gate(xn)) · up(xn)) on RMSNorm(x_mid) ---
    s.x_mid = x;
    s.r_ffn.resize(static_cast<size_t>(n));
    rms_norm_forward(x.data(), W.ffn_norm.data, xn.data(), s.r_ffn.data(), n, d, eps);
    s.gate.resize(static_cast<size_t>(n * hid));
    s.up.resize(static_cast<size_t>(n * hid));
    linear_forward(W.gate, xn.data(), n, s.gate.data());  // [n, hidden]
    linear_forward(W.up, xn.data(), n, s.up.data());      // [n, hidden]
    swiglu_forward(s.gate.data(), s.up.data(), h.data(), n * hid);
    linear_forward(W.down, h.data(), n, proj.data());  // [n, dim]
    for (int64_t i = 0; i < n * d; ++i) x[static_cast<size_t>(i)] += proj[static_cast<size_t>(i)];
  }
  // --- final RMSNorm, LM head, loss ---
  tape.r_final.resize(static_cast<size_t>(n));
  rms_norm_forward(x.data(), w_->final_norm.data, xn.data(), tape.r_final.data(), n, d, eps);
  tape.x_final = std::move(x);
  tape.logits.resize(static_cast<size_t>(n * vocab));
  linear_forward(w_->head, xn.data(), n, tape.logits.data());  // [n, vocab]
  // L = mean over t < n−1 of log Σ_j e^{logit[t, j]} − logit[t, tokens[t+1]]
  double total = 0.0;
  for (int64_t t = 0; t + 1 < n; ++t) {
    const T* row = tape.logits.data() + t * vocab;
    const T m = *std::max_element(row, row + vocab);
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += static_cast<double>(std::exp(row[j] - m));
    total += static_cast<double>(m) + std::log(sum) - static_cast<double>(row[tokens[t + 1]]);
  }
  tape.loss = total / static_cast<double>(n - 1);
}

template <typename T>
double DecoderKVBackward<T>::loss(const int32_t* tokens, int64_t n, const KVPerturbation* perturbation,
                                std::vector<T>* logits) const {
  Tape tape;
  forward(tokens, n, perturbation, tape);
  if (logits) *logits = std::move(tape.logits);
  return tape.loss;
}

template <typename T>
BasicKVGradients<T> DecoderKVBackward<T>::gradients(const int32_t* tokens, int64_t n) const {
  const ModelConfig& c = model_.config();
  const std::vector<T> inv_freq = rope_inv_freq<T>(c.rope_theta, c.head_dim, c.rope_scaling);
  const int64_t d = c.dim, hd = c.head_dim, qw = int64_t(c.n_heads) * hd, kvw = int64_t(c.n_kv_heads) * hd,
                hid = c.hidden_dim, vocab = c.vocab_size;
  Tape tape;
  forward(tokens, n, nullptr, tape);
  BasicKVGradients<T> out;
  out.loss = tape.loss;
  out.tokens = n;
  out.width = kvw;
  out.layers.resize(static_cast<size_t>(c.n_layers));

  // --- loss → logits: dlogits[t] = (softmax(logits[t]) − onehot(tokens[t+1])) / (n−1); row n−1 is 0 ---
  std::vector<T>& dlogits = tape.logits;  // overwritten in place
  const T inv_count = T(1) / static_cast<T>(n - 1);
  for (int64_t t = 0; t < n; ++t) {
    T* row = dlogits.data() + t * vocab;
    if (t + 1 == n) {
      std::fill(row, row + vocab, T(0));
      break;
    }
    const T m = *std::max_element(row, row + vocab);
    T sum = 0;
    for (int64_t j = 0; j < vocab; ++j) sum += (row[j] = std::exp(row[j] - m));
    for (int64_t j = 0; j < vocab; ++j) row[j] = row[j] / sum * inv_count;
    row[tokens[t + 1]] -= inv_count;
  }
  // --- LM head and final RMSNorm: dx[n, dim] = ∂L/∂(residual stream after the last layer) ---
  std::vector<T> dxn(static_cast<size_t>(n * d)), dx(static_cast<size_t>(n * d), T(0));
  linear_backward(w_->head, dlogits.data(), n, dxn.data(), false);
  rms_norm_backward(tape.x_final.data(), tape.r_final.data(), w_->final_norm.data, dxn.data(), dx.data(), n, d);

  std::vector<T> dh(static_cast<size_t>(n * hid)), dgate(static_cast<size_t>(n * hid)), dup(static_cast<size_t>(n * hid)),
      datt(static_cast<size_t>(n * qw)), dq(static_cast<size_t>(n * qw));
  for (int l = c.n_layers - 1; l >= 0; --l) {
    const typename Weights::Layer& W = w_->layers[static_cast<size_t>(l)];
    typename Tape::Layer& s = tape.layers[static_cast<size_t>(l)];
    KVLayerGradients<T>& g = out.layers[static_cast<size_t>(l)];
    // --- FFN block backward: dx (= ∂L/∂x_out) becomes ∂L/∂x_mid ---
    linear_backward(W.down, dx.data(), n, dh.data(), false);  // dh[n, hidden]
    swiglu_backward(s.gate.data(), s.up.data(), dh.data(), dgate.data(), dup.data(), n * hid);
    linear_backward(W.gate, dgate.data(), n, dxn.data(), false);  // dxn[n, dim]
    linear_backward(W.up, dup.data(), n, dxn.data(), true);
    rms_norm_backward(s.x_mid.data(), s.r_ffn.data(), W.ffn_norm.data, dxn.data(), dx.data(), n, d);
    // --- attention block backward: dx becomes ∂L/∂x_in ---
    linear_backward(W.o, dx.data(), n, datt.data(), false);  // datt[n, qw]
    g.d_keys.resize(static_cast<size_t>(n * kvw));
    g.d_values.resize(static_cast<size_t>(n * kvw));
    attention_backward(s.q.data(), s.k.data(), s.v.data(), datt.data(), dq.data(), g.d_keys.data(), g.d_values.data(), n,
                       c.n_heads, c.n_kv_heads, hd);
    rope(dq.data(), n, c.n_heads, c.head_dim, inv_freq, c.rope_layout, -1);  // ∂L/∂q before RoPE
    rope(g.d_keys.data(), n, c.n_kv_heads, c.head_dim, inv_freq, c.rope_layout, -1);  // ∂L/∂K before RoPE
    linear_backward(W.q, dq.data(), n, dxn.data(), false);
    linear_backward(W.k, g.d_keys.data(), n, dxn.data(), true);
    linear_backward(W.v, g.d_values.data(), n, dxn.data(), true);
    rms_norm_backward(s.x_in.data(), s.r_attn.data(), W.attn_norm.data, dxn.data(), dx.data(), n, d);
    g.keys = std::move(s.k_pre);
    g.values = std::move(s.v);
  }
  return out;
}

template class DecoderKVBackward<float>;
template class DecoderKVBackward<double>;

KVGradients llama_kv_gradients(const Decoder& model, const int32_t* tokens, int64_t n) {
  return DecoderKVBackward<float>(model).gradients(tokens, n);
}

}  // namespace sq
