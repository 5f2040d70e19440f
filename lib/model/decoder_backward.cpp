#include "model/decoder_backward.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "core/rope_frequencies.h"
#include "ops/ops.h"
#include "ops/sgemm.h"

// Notation: n tokens, d = dim, hd = head_dim, qw = n_heads·hd, kvw = n_kv_heads·hd, hid = hidden_dim,
// E = n_experts, K = experts_per_token; every activation is row-major [n, width], one token a row.
// Forward functions mirror lib/model/decoder.cpp (and lib/ops/ops.cpp) operation by operation, so
// that the FP32 instance reproduces Decoder's logits up to BLAS blocking and exp/tanh rounding.

namespace sq {

namespace {

/// Query rows per attention block: bounds the score buffers to kQueryBlock × n values per thread.
constexpr int64_t kQueryBlock = 64;

// ---- BLAS ------------------------------------------------------------------------------------

/// C[m, n] = alpha · op(A) · op(B) + beta · C, row-major; op(X) = Xᵀ when trans_X.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  ops::sgemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* A, int64_t lda, const double* B,
          int64_t ldb, double beta, double* C, int64_t ldc) {
  ops::dgemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void resize(std::vector<T>& v, int64_t n) {
  v.resize(static_cast<size_t>(n));
}

// ---- weights -----------------------------------------------------------------------------------

/// A read-only array of T bound to FP32 data: float views in place, double widened copies.
/// data == nullptr for an absent tensor (a bias or norm the spec does not have).
template <typename T>
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
  void bind(const Tensor& t) {
    if (t.numel() > 0) bind(t.data(), t.numel());
  }
};

/// A projection y = x·Wᵀ + b: W [out, in] row-major, b [out] or absent.
template <typename T>
struct Proj {
  Vec<T> w, b;
  int64_t out = 0, in = 0;
  const DenseLinear* lin = nullptr;  ///< the model's linear: the FP32 forward runs it (the decoder's own product)
};

/// A norm's weight and bias [d] (LayerNorm with spec.norm_bias; the bias is absent otherwise).
template <typename T>
struct NormW {
  Vec<T> w, b;
};

template <typename T>
struct ExpertW {
  Proj<T> gate, up, down;
};

template <typename T>
struct LayerW {
  NormW<T> attn_norm, attn_post_norm, ffn_norm, ffn_post_norm;
  Vec<T> q_norm, k_norm;          // [hd] (spec.qk_norm)
  Proj<T> q, k, v, o;
  Proj<T> gate, up, down;         // dense MLP (no gate when plain)
  Proj<T> router;                 // [E, d] (mixture of experts)
  std::vector<ExpertW<T>> experts;
  std::vector<T> inv_freq;        // [rope_dim/2] this layer's RoPE frequencies (RoPE models)
  int window = 0;                 // sliding window in tokens, 0 = global
};

template <typename T>
struct ModelW {
  std::vector<LayerW<T>> layers;
  Vec<T> embed;             // [vocab, d]
  Vec<T> positions;         // [max_seq_len + offset, d] (PositionKind::Learned)
  NormW<T> embed_norm;      // (spec.embed_norm)
  NormW<T> final_norm;
  Proj<T> head;             // [vocab, d]
  std::vector<T> slopes;    // [n_heads] ALiBi slopes (Decoder::alibi_slopes), empty otherwise
  T attn_scale = 0;         // softmax scale of q·kᵀ
};

/// The DenseLinear behind `lin`, or UnsupportedError naming the projection.
const DenseLinear& dense(const Linear& lin, const std::string& name) {
  const auto* d = dynamic_cast<const DenseLinear*>(&lin);
  if (!d)
    throw UnsupportedError("K/V gradients (Fisher information) need the FP32 model, but " + name + " is a " +
                           lin.format() + " linear; calibrate the original checkpoint");
  return *d;
}

template <typename T>
void bind_projection(Proj<T>& p, const Linear& lin, const std::string& name) {
  const DenseLinear& d = dense(lin, name);
  p.out = d.out_features();
  p.in = d.in_features();
  p.w.bind(d.weight().data(), p.out * p.in);
  p.b.bind(d.bias());
  p.lin = &d;
}

// ---- forward ops ---------------------------------------------------------------------------------

/// y[n, out] = x[n, in] · Wᵀ + b   (W [out, in] row-major, b [out] or absent)
template <typename T>
void linear_forward(const Proj<T>& p, const T* x, int64_t n, T* y) {
  if constexpr (std::is_same_v<T, float>) {
    // The decoder's own product (DenseLinear: packed oneDNN matmul), so the forward activations
    // equal Decoder::forward's wherever the inputs do.
    p.lin->forward(x, n, y);
    return;
  }
  gemm(false, true, n, p.out, p.in, T(1), x, p.in, p.w.data, p.in, T(0), y, p.out);
  if (p.b.data)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < p.out; ++j) y[t * p.out + j] += p.b.data[j];
}

/// Per-row statistics a norm's backward needs: mean [n] (LayerNorm) and inv [n] = 1/σ (LayerNorm)
/// or 1/rms (RMSNorm).
template <typename T>
struct NormStats {
  std::vector<T> mean, inv;
};

/// The decoder's norm on x [n, d] → y [n, d] (y may alias x), as ops::norm:
///   RMSNorm:   y = x · inv · w,              inv = 1/sqrt(mean x² + eps)
///   LayerNorm: y = (x − μ) · inv · w (+ b),  inv = 1/sqrt(mean (x − μ)² + eps), μ and σ² in double
template <typename T>
void norm_forward(NormKind kind, const T* x, const T* w, const T* b, T* y, NormStats<T>& s, int64_t n, int64_t d, T eps) {
  resize(s.inv, n);
  if (kind == NormKind::LayerNorm) resize(s.mean, n);
  for (int64_t t = 0; t < n; ++t) {
    const T* xr = x + t * d;
    T* yr = y + t * d;
    if (kind == NormKind::RMSNorm) {
      T inv;
      if constexpr (std::is_same_v<T, float>) {
        inv = ops::rms_inv(xr, d, eps);  // the decoder's own sum order: the same normalized rows
      } else {
        T ss = 0;
        for (int64_t j = 0; j < d; ++j) ss += xr[j] * xr[j];
        inv = T(1) / std::sqrt(ss / static_cast<T>(d) + eps);
      }
      s.inv[static_cast<size_t>(t)] = inv;
      for (int64_t j = 0; j < d; ++j) yr[j] = xr[j] * inv * w[j];
      continue;
    }
    double mean = 0.0, var = 0.0;
    for (int64_t j = 0; j < d; ++j) mean += static_cast<double>(xr[j]);
    mean /= static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j) var += (static_cast<double>(xr[j]) - mean) * (static_cast<double>(xr[j]) - mean);
    var /= static_cast<double>(d);
    const T m = static_cast<T>(mean), inv = static_cast<T>(1.0 / std::sqrt(var + static_cast<double>(eps)));
    s.mean[static_cast<size_t>(t)] = m;
    s.inv[static_cast<size_t>(t)] = inv;
    for (int64_t j = 0; j < d; ++j) yr[j] = (xr[j] - m) * inv * w[j] + (b ? b[j] : T(0));
  }
}

/// RoPE (Su et al. 2021) on the first rot_dim channels of every head of x [n, heads·hd] at
/// positions 0 … n−1, in place: pair i (channels (2i, 2i+1) interleaved, (i, i+rot_dim/2)
/// half-split) is rotated by sign · t·inv_freq[i] (inv_freq [rot_dim/2]: the layer's frequencies).
/// sign = +1 is the forward rotation (ops::rope); sign = −1 applies its transpose (= inverse),
/// which is the backward map dx = Rᵀ·dy of y = R·x. Channels ≥ rot_dim pass through unchanged.
template <typename T>
void rope(T* x, int64_t n, int heads, int hd, int rot_dim, const std::vector<T>& inv_freq, RopeLayout layout, int sign) {
  const int half = rot_dim / 2;
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

/// The FFN nonlinearity f(x) (ops::activation; std::exp where Decoder uses ops::fast_exp).
template <typename T>
T activation(Activation a, T x) {
  switch (a) {
    case Activation::GeluTanh: {
      const T k = static_cast<T>(0.7978845608028654), c = static_cast<T>(0.044715f);  // sqrt(2/π), as ops.cpp
      return T(0.5) * x * (T(1) + std::tanh(k * (x + c * x * x * x)));
    }
    case Activation::Gelu: return T(0.5) * x * (T(1) + std::erf(x * static_cast<T>(0.7071067811865476)));
    case Activation::ReLU: return x > T(0) ? x : T(0);
    case Activation::SiLU: break;
  }
  return x / (T(1) + std::exp(-x));
}

/// f'(x) of activation():
///   SiLU       σ(x) · (1 + x·(1 − σ(x)))
///   GeluTanh   ½(1 + tanh u) + ½x · (1 − tanh² u) · k(1 + 3c·x²),   u = k(x + c·x³)
///   Gelu       ½(1 + erf(x/√2)) + x · φ(x),   φ the standard normal density
///   ReLU       1 for x > 0, else 0 (the subgradient 0 at x = 0, as autograd)
template <typename T>
T activation_grad(Activation a, T x) {
  switch (a) {
    case Activation::GeluTanh: {
      const T k = static_cast<T>(0.7978845608028654), c = static_cast<T>(0.044715f);
      const T th = std::tanh(k * (x + c * x * x * x));
      return T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * k * (T(1) + T(3) * c * x * x);
    }
    case Activation::Gelu:
      return T(0.5) * (T(1) + std::erf(x * static_cast<T>(0.7071067811865476))) +
             x * std::exp(T(-0.5) * x * x) * static_cast<T>(0.3989422804014327);
    case Activation::ReLU: return x > T(0) ? T(1) : T(0);
    case Activation::SiLU: break;
  }
  const T s = T(1) / (T(1) + std::exp(-x));
  return s * (T(1) + x * (T(1) - s));
}

/// Causal attention probabilities of query rows r0 … r0+rows−1 of one head over keys 0 … r0+rows−1
/// (Decoder::attention): with lo(i) = max(0, i − window + 1) on a sliding-window layer, else 0,
///   P[i, j] = softmax_{lo(i) ≤ j ≤ i}(scale · q[i]·k[j] − slope · (i − j)),  0 outside [lo(i), i].
/// slope = 0 without ALiBi. q rows have stride ldq, k rows stride ldk; P: [rows, r0+rows].
template <typename T>
void attention_probs(const T* q, int64_t ldq, const T* k, int64_t ldk, int64_t hd, int64_t r0, int64_t rows, T scale,
                     T slope, int window, T* P) {
  const int64_t n_keys = r0 + rows;
  gemm(false, true, rows, n_keys, hd, scale, q + r0 * ldq, ldq, k, ldk, T(0), P, n_keys);  // S = scale·Q·Kᵀ
  for (int64_t i = 0; i < rows; ++i) {
    T* row = P + i * n_keys;
    const int64_t pos = r0 + i, visible = pos + 1;
    const int64_t lo = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
    if (slope != T(0))
      for (int64_t j = lo; j < visible; ++j) row[j] -= slope * static_cast<T>(pos - j);
    const T m = *std::max_element(row + lo, row + visible);
    T sum = 0;
    for (int64_t j = lo; j < visible; ++j) sum += (row[j] = std::exp(row[j] - m));
    for (int64_t j = lo; j < visible; ++j) row[j] /= sum;
    std::fill(row, row + lo, T(0));
    std::fill(row + visible, row + n_keys, T(0));
  }
}

/// Grouped-query causal attention at positions 0 … n−1: q [n, qw], k, v [n, kvw] (RoPE already
/// applied), out [n, qw]; query head h reads KV head h / (n_heads / n_kv):
///   out_h = P_h · V_g   with P_h from attention_probs (scale, ALiBi slope of head h, window)
template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* out, int64_t n, int n_heads, int n_kv, int64_t hd, T scale,
                       const std::vector<T>& slopes, int window) {
  const int64_t qw = int64_t(n_heads) * hd, kvw = int64_t(n_kv) * hd;
  const int group = n_heads / n_kv;
#pragma omp parallel for schedule(dynamic) if (!omp_in_parallel() && n_kv > 1 && n >= 256)
  for (int g = 0; g < n_kv; ++g) {
    std::vector<T> P;
    for (int h = g * group; h < (g + 1) * group; ++h)
      for (int64_t r0 = 0; r0 < n; r0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, n - r0), n_keys = r0 + rows;
        resize(P, rows * n_keys);
        const T slope = slopes.empty() ? T(0) : slopes[static_cast<size_t>(h)];
        attention_probs(q + h * hd, qw, k + g * hd, kvw, hd, r0, rows, scale, slope, window, P.data());
        // out_h[rows, hd] = P[rows, n_keys] · V_g[n_keys, hd]
        gemm(false, false, rows, hd, n_keys, T(1), P.data(), n_keys, v + g * hd, kvw, T(0), out + r0 * qw + h * hd, qw);
      }
  }
}

// ---- backward ops (each takes the output gradient and writes / accumulates the input gradient) ----

/// dx[n, in] = dy[n, out] · W  (+= when accumulate); y = x·Wᵀ + b (the bias has no input gradient).
template <typename T>
void linear_backward(const Proj<T>& p, const T* dy, int64_t n, T* dx, bool accumulate) {
  gemm(false, false, n, p.in, p.out, T(1), dy, p.out, p.w.data, p.in, accumulate ? T(1) : T(0), dx, p.in);
}

/// Norm backward, accumulated into dx [n, d] (x the norm's input, s its saved statistics):
///   RMSNorm:   ∂L/∂x_j = inv·w_j·dy_j − (inv³/d) · x_j · Σ_k dy_k·w_k·x_k
///   LayerNorm: with x̂ = (x − μ)·inv and g = dy ⊙ w:  ∂L/∂x = inv · (g − mean(g) − x̂ · mean(g ⊙ x̂))
/// (the bias has no input gradient).
template <typename T>
void norm_backward(NormKind kind, const T* x, const NormStats<T>& s, const T* w, const T* dy, T* dx, int64_t n, int64_t d) {
  for (int64_t t = 0; t < n; ++t) {
    const T* xr = x + t * d;
    const T* g = dy + t * d;
    T* out = dx + t * d;
    const T inv = s.inv[static_cast<size_t>(t)];
    if (kind == NormKind::RMSNorm) {
      T dot = 0;
      for (int64_t k = 0; k < d; ++k) dot += g[k] * w[k] * xr[k];
      const T c = inv * inv * inv / static_cast<T>(d) * dot;
      for (int64_t j = 0; j < d; ++j) out[j] += inv * w[j] * g[j] - c * xr[j];
      continue;
    }
    const T m = s.mean[static_cast<size_t>(t)];
    T mean_g = 0, mean_gx = 0;
    for (int64_t k = 0; k < d; ++k) {
      mean_g += g[k] * w[k];
      mean_gx += g[k] * w[k] * (xr[k] - m) * inv;
    }
    mean_g /= static_cast<T>(d);
    mean_gx /= static_cast<T>(d);
    for (int64_t j = 0; j < d; ++j) out[j] += inv * (g[j] * w[j] - mean_g - (xr[j] - m) * inv * mean_gx);
  }
}

/// Attention backward (shapes as attention_forward; dout [n, qw]); dq [n, qw], dk, dv [n, kvw]
/// overwritten, all with respect to the post-RoPE q and k. Per query head h of KV group g,
/// recomputing P from q and k (nothing n² is saved by the forward):
///   dP = dO_h·V_gᵀ;  dV_g += Pᵀ·dO_h;  dS = P ⊙ (dP − rowsum(P ⊙ dP));
///   dQ_h = scale·dS·K_g;  dK_g += scale·dSᵀ·Q_h.
/// The ALiBi bias is a constant and masked entries have P = 0 (hence dS = 0): neither changes these
/// formulas. The heads of one group accumulate into the same dK_g, dV_g, so work is split over KV
/// groups (fixed accumulation order: deterministic).
template <typename T>
void attention_backward(const T* q, const T* k, const T* v, const T* dout, T* dq, T* dk, T* dv, int64_t n, int n_heads,
                        int n_kv, int64_t hd, T scale, const std::vector<T>& slopes, int window) {
  const int64_t qw = int64_t(n_heads) * hd, kvw = int64_t(n_kv) * hd;
  const int group = n_heads / n_kv;
  std::fill(dk, dk + n * kvw, T(0));
  std::fill(dv, dv + n * kvw, T(0));
#pragma omp parallel for schedule(dynamic) if (!omp_in_parallel() && n_kv > 1 && n >= 256)
  for (int g = 0; g < n_kv; ++g) {
    std::vector<T> P, dP;
    for (int h = g * group; h < (g + 1) * group; ++h)
      for (int64_t r0 = 0; r0 < n; r0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, n - r0), n_keys = r0 + rows;
        resize(P, rows * n_keys);
        resize(dP, rows * n_keys);
        const T slope = slopes.empty() ? T(0) : slopes[static_cast<size_t>(h)];
        attention_probs(q + h * hd, qw, k + g * hd, kvw, hd, r0, rows, scale, slope, window, P.data());
        const T* dO = dout + r0 * qw + h * hd;  // [rows, hd], stride qw
        // dP[rows, n_keys] = dO[rows, hd] · V_g[n_keys, hd]ᵀ
        gemm(false, true, rows, n_keys, hd, T(1), dO, qw, v + g * hd, kvw, T(0), dP.data(), n_keys);
        // dV_g[n_keys, hd] += P[rows, n_keys]ᵀ · dO[rows, hd]
        gemm(true, false, n_keys, hd, rows, T(1), P.data(), n_keys, dO, qw, T(1), dv + g * hd, kvw);
        // dS = P ⊙ (dP − Σ_j P⊙dP), in place of dP
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

// ---- the FFN: dense MLP or mixture of experts ------------------------------------------------------

/// What the FFN's backward needs. Dense: the pre-activation projections. Experts: the routing and,
/// per expert, the tokens it ran on with its pre-activations and its (unweighted) output.
template <typename T>
struct FfnTape {
  std::vector<T> gate, up;  // [n, hid]: gate(u), up(u) (gated); up holds fc1(u) for a plain MLP
  std::vector<T> probs;     // [n, E] router softmax
  std::vector<T> weight;    // [n, E] routing weight p_e / Σ_top-k p, 0 for unselected experts
  struct Expert {
    std::vector<int64_t> rows;  // [m] tokens routed to this expert, ascending
    std::vector<T> gate, up;    // [m, hid]
    std::vector<T> out;         // [m, d] the expert's output before weighting
  };
  std::vector<Expert> experts;  // [E]
};

/// One gated MLP (or expert) on u [m, d] → y [m, d]: y = down(f(gate(u)) ⊙ up(u)); saves gate, up.
template <typename T>
void gated_forward(const Proj<T>& gate, const Proj<T>& up, const Proj<T>& down, Activation act, const T* u, int64_t m,
                   T* y, std::vector<T>& g, std::vector<T>& v) {
  const int64_t hid = up.out;
  resize(g, m * hid);
  resize(v, m * hid);
  linear_forward(gate, u, m, g.data());  // [m, hid]
  linear_forward(up, u, m, v.data());    // [m, hid]
  std::vector<T> h(static_cast<size_t>(m * hid));
  for (int64_t i = 0; i < m * hid; ++i) h[static_cast<size_t>(i)] = activation(act, g[static_cast<size_t>(i)]) * v[static_cast<size_t>(i)];
  linear_forward(down, h.data(), m, y);  // [m, d]
}

/// Its backward: du[m, d] (+= when accumulate) from dy[m, d]; with a = f(g):
///   dh = dy·W_down;  dg = dh ⊙ v ⊙ f'(g);  dv = dh ⊙ f(g);  du = dg·W_gate + dv·W_up
template <typename T>
void gated_backward(const Proj<T>& gate, const Proj<T>& up, const Proj<T>& down, Activation act, const std::vector<T>& g,
                    const std::vector<T>& v, const T* dy, int64_t m, T* du, bool accumulate) {
  const int64_t hid = up.out;
  std::vector<T> dh(static_cast<size_t>(m * hid)), dg(static_cast<size_t>(m * hid));
  linear_backward(down, dy, m, dh.data(), false);
  for (int64_t i = 0; i < m * hid; ++i) {
    const size_t j = static_cast<size_t>(i);
    dg[j] = dh[j] * v[j] * activation_grad(act, g[j]);
    dh[j] = dh[j] * activation(act, g[j]);  // now ∂L/∂up
  }
  linear_backward(gate, dg.data(), m, du, accumulate);
  linear_backward(up, dh.data(), m, du, true);
}

/// The FFN of a layer on u [n, d] → y [n, d] (layer_flow::mlp / experts, model/decoder_layer_flow.h):
///   gated:   y = down(f(gate(u)) ⊙ up(u))
///   plain:   y = down(f(up(u)))
///   experts: p = softmax(router(u)) per token; the top-K experts by p (ties: lower index first)
///            run on the token; y = Σ_top-k w_e · expert_e(u), w_e = p_e / Σ_top-k p
template <typename T>
void ffn_forward(const LayerW<T>& W, const DecoderSpec& sp, const T* u, int64_t n, int64_t d, T* y, FfnTape<T>& s) {
  if (sp.n_experts == 0 && sp.mlp_gated) {
    gated_forward(W.gate, W.up, W.down, sp.activation, u, n, y, s.gate, s.up);
    return;
  }
  if (sp.n_experts == 0) {
    const int64_t hid = W.up.out;
    resize(s.up, n * hid);
    linear_forward(W.up, u, n, s.up.data());  // fc1 [n, hid]
    std::vector<T> h(static_cast<size_t>(n * hid));
    for (int64_t i = 0; i < n * hid; ++i) h[static_cast<size_t>(i)] = activation(sp.activation, s.up[static_cast<size_t>(i)]);
    linear_forward(W.down, h.data(), n, y);  // fc2 [n, d]
    return;
  }
  const int E = sp.n_experts, K = sp.experts_per_token;
  resize(s.probs, n * E);
  s.weight.assign(static_cast<size_t>(n * E), T(0));
  linear_forward(W.router, u, n, s.probs.data());  // router logits [n, E]
  std::vector<int> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    T* p = s.probs.data() + t * E;
    const T m = *std::max_element(p, p + E);
    T sum = 0;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(p[e] - m));
    for (int e = 0; e < E; ++e) p[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    T top = 0;
    for (int k = 0; k < K; ++k) top += p[order[static_cast<size_t>(k)]];
    for (int k = 0; k < K; ++k) {
      const int e = order[static_cast<size_t>(k)];
      s.weight[static_cast<size_t>(t * E + e)] = p[e] / top;
    }
  }
  std::fill(y, y + n * d, T(0));
  s.experts.assign(static_cast<size_t>(E), {});
  for (int e = 0; e < E; ++e) {
    typename FfnTape<T>::Expert& X = s.experts[static_cast<size_t>(e)];
    for (int64_t t = 0; t < n; ++t)
      if (s.weight[static_cast<size_t>(t * E + e)] != T(0)) X.rows.push_back(t);
    const int64_t m = static_cast<int64_t>(X.rows.size());
    if (m == 0) continue;
    std::vector<T> ue(static_cast<size_t>(m * d));  // [m, d] gathered inputs
    for (int64_t i = 0; i < m; ++i) std::copy_n(u + X.rows[static_cast<size_t>(i)] * d, d, ue.begin() + i * d);
    resize(X.out, m * d);
    const ExpertW<T>& XW = W.experts[static_cast<size_t>(e)];
    gated_forward(XW.gate, XW.up, XW.down, sp.activation, ue.data(), m, X.out.data(), X.gate, X.up);
    for (int64_t i = 0; i < m; ++i) {
      const int64_t t = X.rows[static_cast<size_t>(i)];
      const T w = s.weight[static_cast<size_t>(t * E + e)];
      for (int64_t j = 0; j < d; ++j) y[t * d + j] += X.out[static_cast<size_t>(i * d + j)] * w;
    }
  }
}

/// The FFN's backward: du[n, d] overwritten from dy[n, d]. For experts, with the selection fixed
/// (see the header): d(out_e) = w_e·dy, dw_e = dy·out_e for the selected e; through the
/// renormalization w_e = p_e / S (S = Σ_top-k p): dp_e = (dw_e − Σ_top-k dw·w) / S for selected e,
/// 0 otherwise; through the softmax dr = p ⊙ (dp − Σ p⊙dp); du += dr·W_router.
template <typename T>
void ffn_backward(const LayerW<T>& W, const DecoderSpec& sp, const FfnTape<T>& s, const T* dy, int64_t n, int64_t d, T* du) {
  if (sp.n_experts == 0 && sp.mlp_gated) {
    gated_backward(W.gate, W.up, W.down, sp.activation, s.gate, s.up, dy, n, du, false);
    return;
  }
  if (sp.n_experts == 0) {
    const int64_t hid = W.up.out;
    std::vector<T> dh(static_cast<size_t>(n * hid));
    linear_backward(W.down, dy, n, dh.data(), false);
    for (int64_t i = 0; i < n * hid; ++i) dh[static_cast<size_t>(i)] *= activation_grad(sp.activation, s.up[static_cast<size_t>(i)]);
    linear_backward(W.up, dh.data(), n, du, false);
    return;
  }
  const int E = sp.n_experts;
  std::fill(du, du + n * d, T(0));
  std::vector<T> dweight(static_cast<size_t>(n * E), T(0));  // [n, E] ∂L/∂w_e of the selected experts
  for (int e = 0; e < E; ++e) {
    const typename FfnTape<T>::Expert& X = s.experts[static_cast<size_t>(e)];
    const int64_t m = static_cast<int64_t>(X.rows.size());
    if (m == 0) continue;
    std::vector<T> dout(static_cast<size_t>(m * d)), due(static_cast<size_t>(m * d));  // [m, d]
    for (int64_t i = 0; i < m; ++i) {
      const int64_t t = X.rows[static_cast<size_t>(i)];
      const T w = s.weight[static_cast<size_t>(t * E + e)];
      T dw = 0;
      for (int64_t j = 0; j < d; ++j) {
        dout[static_cast<size_t>(i * d + j)] = dy[t * d + j] * w;
        dw += dy[t * d + j] * X.out[static_cast<size_t>(i * d + j)];
      }
      dweight[static_cast<size_t>(t * E + e)] = dw;
    }
    const ExpertW<T>& XW = W.experts[static_cast<size_t>(e)];
    gated_backward(XW.gate, XW.up, XW.down, sp.activation, X.gate, X.up, dout.data(), m, due.data(), false);
    for (int64_t i = 0; i < m; ++i)  // scatter back to the tokens
      for (int64_t j = 0; j < d; ++j) du[X.rows[static_cast<size_t>(i)] * d + j] += due[static_cast<size_t>(i * d + j)];
  }
  std::vector<T> dr(static_cast<size_t>(n * E));  // [n, E] ∂L/∂router logits
  for (int64_t t = 0; t < n; ++t) {
    const T* p = s.probs.data() + t * E;
    const T* w = s.weight.data() + t * E;
    const T* dw = dweight.data() + t * E;
    T top = 0, wdw = 0;
    for (int e = 0; e < E; ++e)
      if (w[e] != T(0)) {
        top += p[e];
        wdw += w[e] * dw[e];
      }
    T* g = dr.data() + t * E;  // first ∂L/∂p, then ∂L/∂logits
    T pdp = 0;
    for (int e = 0; e < E; ++e) {
      g[e] = w[e] != T(0) ? (dw[e] - wdw) / top : T(0);
      pdp += p[e] * g[e];
    }
    for (int e = 0; e < E; ++e) g[e] = p[e] * (g[e] - pdp);
  }
  linear_backward(W.router, dr.data(), n, du, true);
}

}  // namespace

// ---- weights and tape ------------------------------------------------------------------------------

template <typename T>
struct DecoderKVBackward<T>::Weights : ModelW<T> {};

/// The activations one window's forward saves for the backward.
template <typename T>
struct DecoderKVBackward<T>::Tape {
  struct Layer {
    std::vector<T> x_in;           // [n, d] residual stream entering the layer
    NormStats<T> attn_norm;        // of x_in
    std::vector<T> q_raw, k_raw;   // [n, qw], [n, kvw] projections before QK-norm (spec.qk_norm)
    NormStats<T> q_norm, k_norm;   // per (token, head) rows of width hd
    std::vector<T> q;              // [n, qw] after QK-norm and RoPE
    std::vector<T> k_cache, k;     // [n, kvw] the cached key (before RoPE) / after RoPE
    std::vector<T> v;              // [n, kvw]
    std::vector<T> a_raw;          // [n, d] o_proj output before the post-attention norm
    NormStats<T> attn_post_norm;
    std::vector<T> x_mid;          // [n, d] residual stream after the attention block (sequential)
    NormStats<T> ffn_norm;         // of x_mid (sequential) or x_in (parallel, two norms)
    FfnTape<T> ffn;
    std::vector<T> m_raw;          // [n, d] FFN output before the post-FFN norm
    NormStats<T> ffn_post_norm;
  };
  int64_t n = 0;
  std::vector<Layer> layers;
  std::vector<T> x_final;  // [n, d] residual stream after the last layer
  NormStats<T> final_norm;
  std::vector<T> logits;   // [n, vocab]
  double loss = 0.0;
};

template <typename T>
DecoderKVBackward<T>::DecoderKVBackward(const Decoder& model) : model_(model), w_(std::make_unique<Weights>()) {
  const ModelConfig& c = model.config();
  const DecoderSpec& sp = c.spec;
  if (model.embedding().numel() == 0)
    throw UnsupportedError("K/V gradients (Fisher information) need the FP32 model, but its token embedding is stored "
                           "quantized; calibrate the original checkpoint");
  ModelW<T>& M = *w_;
  M.layers.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const DecoderLayer& L = model.layers()[static_cast<size_t>(l)];
    LayerW<T>& W = M.layers[static_cast<size_t>(l)];
    const std::string p = "layer " + std::to_string(l) + " ";
    W.attn_norm.w.bind(L.attn_norm);
    W.attn_norm.b.bind(L.attn_norm_bias);
    W.attn_post_norm.w.bind(L.attn_post_norm);
    W.attn_post_norm.b.bind(L.attn_post_norm_bias);
    W.ffn_norm.w.bind(L.ffn_norm);
    W.ffn_norm.b.bind(L.ffn_norm_bias);
    W.ffn_post_norm.w.bind(L.ffn_post_norm);
    W.ffn_post_norm.b.bind(L.ffn_post_norm_bias);
    W.q_norm.bind(L.q_norm);
    W.k_norm.bind(L.k_norm);
    bind_projection(W.q, *L.q_proj, p + "q_proj");
    bind_projection(W.k, *L.k_proj, p + "k_proj");
    bind_projection(W.v, *L.v_proj, p + "v_proj");
    bind_projection(W.o, *L.o_proj, p + "o_proj");
    if (sp.n_experts > 0) {
      bind_projection(W.router, *L.router, p + "router");
      W.experts.resize(L.experts.size());
      for (size_t e = 0; e < L.experts.size(); ++e) {
        const std::string x = p + "expert " + std::to_string(e) + " ";
        bind_projection(W.experts[e].gate, *L.experts[e].gate_proj, x + "gate_proj");
        bind_projection(W.experts[e].up, *L.experts[e].up_proj, x + "up_proj");
        bind_projection(W.experts[e].down, *L.experts[e].down_proj, x + "down_proj");
      }
    } else {
      if (sp.mlp_gated) bind_projection(W.gate, *L.gate_proj, p + "gate_proj");
      bind_projection(W.up, *L.up_proj, p + "up_proj");
      bind_projection(W.down, *L.down_proj, p + "down_proj");
    }
    W.inv_freq = rope_inv_freq<T>(c, l);
    W.window = c.window(l);
  }
  M.embed.bind(model.embedding());
  M.positions.bind(model.globals().embed_positions);
  M.embed_norm.w.bind(model.globals().embed_norm);
  M.embed_norm.b.bind(model.globals().embed_norm_bias);
  M.final_norm.w.bind(model.final_norm());
  M.final_norm.b.bind(model.globals().final_norm_bias);
  bind_projection(M.head, model.lm_head(), "the LM head");
  M.slopes.assign(model.alibi_slopes().begin(), model.alibi_slopes().end());
  // Decoder: s = spec.attn_scale, or 1/√hd computed in FP32
  M.attn_scale = sp.attn_scale > 0.0f ? static_cast<T>(sp.attn_scale) : T(1) / std::sqrt(static_cast<T>(c.head_dim));
}

template <typename T>
DecoderKVBackward<T>::~DecoderKVBackward() = default;

template <typename T>
void DecoderKVBackward<T>::forward(const int32_t* tokens, int64_t n, const KVPerturbation* pert, Tape& tape) const {
  const ModelConfig& c = model_.config();
  const DecoderSpec& sp = c.spec;
  const ModelW<T>& M = *w_;
  const int64_t d = c.dim, hd = c.head_dim, qw = int64_t(c.n_heads) * hd, kvw = int64_t(c.n_kv_heads) * hd,
                vocab = c.vocab_size;
  if (n < 2 || n > c.max_seq_len)
    throw std::invalid_argument("K/V gradients need 2 … " + std::to_string(c.max_seq_len) + " tokens, got " +
                                std::to_string(n));
  if (pert && (pert->layer < 0 || pert->layer >= c.n_layers || pert->token < 0 || pert->token >= n ||
               pert->channel < 0 || pert->channel >= kvw))
    throw std::invalid_argument("KVPerturbation outside [" + std::to_string(c.n_layers) + " layers] × [" +
                                std::to_string(n) + " tokens] × [" + std::to_string(kvw) + " channels]");
  const T eps = static_cast<T>(c.norm_eps);
  tape.n = n;
  tape.layers.resize(static_cast<size_t>(c.n_layers));

  // --- input (Decoder::embed at text positions 0 … n−1): x[n, d] = embed[tokens] · embed_scale
  //     (+ learned position rows t + offset), then the embedding norm. No K/V depends on it. ---
  std::vector<T> x(static_cast<size_t>(n * d)), h(static_cast<size_t>(n * d)), att(static_cast<size_t>(n * qw)),
      a(static_cast<size_t>(n * d)), m(static_cast<size_t>(n * d));
  for (int64_t t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= vocab)
      throw std::out_of_range("token id " + std::to_string(tokens[t]) + " outside the vocabulary of " +
                              std::to_string(vocab));
    std::copy_n(M.embed.data + int64_t(tokens[t]) * d, d, x.begin() + t * d);
  }
  if (sp.embed_scale != 1.0f)
    for (T& v : x) v *= static_cast<T>(sp.embed_scale);
  if (sp.position == PositionKind::Learned)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < d; ++j) x[static_cast<size_t>(t * d + j)] += M.positions.data[(t + sp.learned_position_offset) * d + j];
  if (sp.embed_norm) {
    NormStats<T> unused;
    norm_forward(sp.norm, x.data(), M.embed_norm.w.data, M.embed_norm.b.data, x.data(), unused, n, d, eps);
  }

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerW<T>& W = M.layers[static_cast<size_t>(l)];
    typename Tape::Layer& s = tape.layers[static_cast<size_t>(l)];
    // --- attention: h = norm(x); q, k, v = projections; [QK-norm]; the cached key; RoPE ---
    s.x_in = x;
    norm_forward(sp.norm, x.data(), W.attn_norm.w.data, W.attn_norm.b.data, h.data(), s.attn_norm, n, d, eps);
    resize(s.q, n * qw);
    resize(s.k_cache, n * kvw);
    resize(s.v, n * kvw);
    linear_forward(W.q, h.data(), n, s.q.data());        // [n, qw]
    linear_forward(W.k, h.data(), n, s.k_cache.data());  // [n, kvw]
    linear_forward(W.v, h.data(), n, s.v.data());        // [n, kvw]
    if (sp.qk_norm) {  // RMSNorm of every head over hd: rows [n·heads, hd]
      s.q_raw = s.q;
      s.k_raw = s.k_cache;
      norm_forward(NormKind::RMSNorm, s.q_raw.data(), W.q_norm.data, static_cast<const T*>(nullptr), s.q.data(), s.q_norm,
                   n * c.n_heads, hd, eps);
      norm_forward(NormKind::RMSNorm, s.k_raw.data(), W.k_norm.data, static_cast<const T*>(nullptr), s.k_cache.data(),
                   s.k_norm, n * c.n_kv_heads, hd, eps);
    }
    if (pert && pert->layer == l) {  // K/V as the cache receives them
      std::vector<T>& target = pert->tensor == KVTensor::Key ? s.k_cache : s.v;
      target[static_cast<size_t>(pert->token * kvw + pert->channel)] += static_cast<T>(pert->delta);
    }
    s.k = s.k_cache;
    if (sp.position == PositionKind::Rope) {  // the first rope_dim channels of every head
      rope(s.q.data(), n, c.n_heads, c.head_dim, c.rope_dim(), W.inv_freq, c.rope_layout, +1);
      rope(s.k.data(), n, c.n_kv_heads, c.head_dim, c.rope_dim(), W.inv_freq, c.rope_layout, +1);
    }
    attention_forward(s.q.data(), s.k.data(), s.v.data(), att.data(), n, c.n_heads, c.n_kv_heads, hd, M.attn_scale,
                      M.slopes, W.window);  // [n, qw]
    linear_forward(W.o, att.data(), n, a.data());  // a[n, d]
    if (sp.post_attn_norm) {
      s.a_raw = a;
      norm_forward(sp.norm, s.a_raw.data(), W.attn_post_norm.w.data, W.attn_post_norm.b.data, a.data(), s.attn_post_norm, n,
                   d, eps);
    }
    if (sp.parallel_residual) {
      // --- parallel: x += (mlp(shared ? h : norm(x; ffn_norm)) + a) ---
      if (!sp.shared_input_norm) norm_forward(sp.norm, x.data(), W.ffn_norm.w.data, W.ffn_norm.b.data, h.data(), s.ffn_norm, n, d, eps);
      ffn_forward(W, sp, h.data(), n, d, m.data(), s.ffn);
      for (int64_t i = 0; i < n * d; ++i) m[static_cast<size_t>(i)] += a[static_cast<size_t>(i)];
      for (int64_t i = 0; i < n * d; ++i) x[static_cast<size_t>(i)] += m[static_cast<size_t>(i)];
      continue;
    }
    // --- sequential: x += a; x += [post-norm] mlp(norm(x; ffn_norm)) ---
    for (int64_t i = 0; i < n * d; ++i) x[static_cast<size_t>(i)] += a[static_cast<size_t>(i)];
    s.x_mid = x;
    norm_forward(sp.norm, x.data(), W.ffn_norm.w.data, W.ffn_norm.b.data, h.data(), s.ffn_norm, n, d, eps);
    ffn_forward(W, sp, h.data(), n, d, m.data(), s.ffn);
    if (sp.post_ffn_norm) {
      s.m_raw = m;
      norm_forward(sp.norm, s.m_raw.data(), W.ffn_post_norm.w.data, W.ffn_post_norm.b.data, m.data(), s.ffn_post_norm, n, d,
                   eps);
    }
    for (int64_t i = 0; i < n * d; ++i) x[static_cast<size_t>(i)] += m[static_cast<size_t>(i)];
  }
  // --- final norm, LM head, loss ---
  norm_forward(sp.norm, x.data(), M.final_norm.w.data, M.final_norm.b.data, h.data(), tape.final_norm, n, d, eps);
  tape.x_final = std::move(x);
  resize(tape.logits, n * vocab);
  linear_forward(M.head, h.data(), n, tape.logits.data());  // [n, vocab]
  // L = mean over t < n−1 of log Σ_j e^{logit[t, j]} − logit[t, tokens[t+1]]
  double total = 0.0;
  for (int64_t t = 0; t + 1 < n; ++t) {
    const T* row = tape.logits.data() + t * vocab;
    const T mx = *std::max_element(row, row + vocab);
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += static_cast<double>(std::exp(row[j] - mx));
    total += static_cast<double>(mx) + std::log(sum) - static_cast<double>(row[tokens[t + 1]]);
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
  const DecoderSpec& sp = c.spec;
  const ModelW<T>& M = *w_;
  const int64_t d = c.dim, hd = c.head_dim, qw = int64_t(c.n_heads) * hd, kvw = int64_t(c.n_kv_heads) * hd,
                vocab = c.vocab_size;
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
    const T mx = *std::max_element(row, row + vocab);
    T sum = 0;
    for (int64_t j = 0; j < vocab; ++j) sum += (row[j] = std::exp(row[j] - mx));
    for (int64_t j = 0; j < vocab; ++j) row[j] = row[j] / sum * inv_count;
    row[tokens[t + 1]] -= inv_count;
  }
  // --- LM head and final norm: dx[n, d] = ∂L/∂(residual stream after the last layer) ---
  std::vector<T> dh(static_cast<size_t>(n * d)), dx(static_cast<size_t>(n * d), T(0));
  linear_backward(M.head, dlogits.data(), n, dh.data(), false);
  norm_backward(sp.norm, tape.x_final.data(), tape.final_norm, M.final_norm.w.data, dh.data(), dx.data(), n, d);

  std::vector<T> da(static_cast<size_t>(n * d)), du(static_cast<size_t>(n * d)), datt(static_cast<size_t>(n * qw)),
      dq(static_cast<size_t>(n * qw)), tmp(static_cast<size_t>(n * d));
  for (int l = c.n_layers - 1; l >= 0; --l) {
    const LayerW<T>& W = M.layers[static_cast<size_t>(l)];
    typename Tape::Layer& s = tape.layers[static_cast<size_t>(l)];
    KVLayerGradients<T>& g = out.layers[static_cast<size_t>(l)];
    // dx = ∂L/∂x_out on entry. The FFN block first; afterwards da = ∂L/∂a (attention block output
    // after its post-norm) and dx = ∂L/∂x_in less the attention input norm's share.
    if (sp.parallel_residual) {
      // x_out = x_in + mlp(u) + a:  da = dm = dx
      da = dx;
      ffn_backward(W, sp, s.ffn, dx.data(), n, d, du.data());  // du = ∂L/∂u
      if (!sp.shared_input_norm)  // u = norm(x_in; ffn_norm); with a shared norm du joins dh below
        norm_backward(sp.norm, s.x_in.data(), s.ffn_norm, W.ffn_norm.w.data, du.data(), dx.data(), n, d);
    } else {
      // x_out = x_mid + post_norm(mlp(norm(x_mid))):  dx becomes ∂L/∂x_mid = da
      const T* dm = dx.data();
      if (sp.post_ffn_norm) {
        std::fill(tmp.begin(), tmp.end(), T(0));
        norm_backward(sp.norm, s.m_raw.data(), s.ffn_post_norm, W.ffn_post_norm.w.data, dx.data(), tmp.data(), n, d);
        dm = tmp.data();
      }
      ffn_backward(W, sp, s.ffn, dm, n, d, du.data());
      norm_backward(sp.norm, s.x_mid.data(), s.ffn_norm, W.ffn_norm.w.data, du.data(), dx.data(), n, d);
      da = dx;
    }
    // --- attention block backward: [post-norm] → o_proj → attention → RoPE⁻¹ → ∂L/∂K, ∂L/∂V ---
    if (sp.post_attn_norm) {
      std::fill(tmp.begin(), tmp.end(), T(0));
      norm_backward(sp.norm, s.a_raw.data(), s.attn_post_norm, W.attn_post_norm.w.data, da.data(), tmp.data(), n, d);
      da.swap(tmp);
    }
    linear_backward(W.o, da.data(), n, datt.data(), false);  // datt[n, qw]
    resize(g.d_keys, n * kvw);
    resize(g.d_values, n * kvw);
    attention_backward(s.q.data(), s.k.data(), s.v.data(), datt.data(), dq.data(), g.d_keys.data(), g.d_values.data(), n,
                       c.n_heads, c.n_kv_heads, hd, M.attn_scale, M.slopes, W.window);
    if (sp.position == PositionKind::Rope) {
      rope(dq.data(), n, c.n_heads, c.head_dim, c.rope_dim(), W.inv_freq, c.rope_layout, -1);        // ∂L/∂q before RoPE
      rope(g.d_keys.data(), n, c.n_kv_heads, c.head_dim, c.rope_dim(), W.inv_freq, c.rope_layout, -1);  // ∂L/∂K
    }
    g.keys = std::move(s.k_cache);
    g.values = std::move(s.v);
    if (l == 0) break;  // nothing below layer 0's K and V needs a gradient
    // --- [QK-norm] → q/k/v projections → input norm: dx += ∂L/∂x_in through the attention ---
    const T* dk_proj = g.d_keys.data();
    std::vector<T> dk_raw;
    if (sp.qk_norm) {
      std::vector<T> dq_raw(static_cast<size_t>(n * qw), T(0));
      dk_raw.assign(static_cast<size_t>(n * kvw), T(0));
      norm_backward(NormKind::RMSNorm, s.q_raw.data(), s.q_norm, W.q_norm.data, dq.data(), dq_raw.data(), n * c.n_heads, hd);
      norm_backward(NormKind::RMSNorm, s.k_raw.data(), s.k_norm, W.k_norm.data, g.d_keys.data(), dk_raw.data(),
                    n * c.n_kv_heads, hd);
      dq.swap(dq_raw);
      dk_proj = dk_raw.data();
    }
    linear_backward(W.q, dq.data(), n, dh.data(), false);  // dh[n, d] = ∂L/∂h
    linear_backward(W.k, dk_proj, n, dh.data(), true);
    linear_backward(W.v, g.d_values.data(), n, dh.data(), true);
    if (sp.parallel_residual && sp.shared_input_norm)
      for (int64_t i = 0; i < n * d; ++i) dh[static_cast<size_t>(i)] += du[static_cast<size_t>(i)];
    norm_backward(sp.norm, s.x_in.data(), s.attn_norm, W.attn_norm.w.data, dh.data(), dx.data(), n, d);
  }
  return out;
}

template class DecoderKVBackward<float>;
template class DecoderKVBackward<double>;

KVGradients kv_gradients(const Decoder& model, const int32_t* tokens, int64_t n) {
  return DecoderKVBackward<float>(model).gradients(tokens, n);
}

}  // namespace sq
