// Reverse-mode gradients of the decoder's next-token loss with respect to every layer's keys and
// values, for KVQuant's Fisher-weighted codebooks (Hooper et al. 2024, "KVQuant", §3.3, Eq. 2:
// F_ii = (∂L/∂A_i)², the diagonal Fisher information of an activation A).
//
// The module carries its own forward pass — the one of run_decoder_layer (lib/model/decoder_layer_flow.h) and
// Decoder::attention, configured by the same DecoderSpec and mirrored operation by
// operation — that saves the activations the backward needs (it does not touch Decoder's KV cache or
// workspace), then walks the decoder in reverse: LM head → final norm → per layer (last to first)
// [post-FFN norm] → MLP / experts → FFN norm → [post-attention norm] → o_proj → causal attention
// (scale, ALiBi bias, sliding window) → RoPE (partial, per-layer frequencies) → [QK-norm] → q/k/v
// projections → input norm, with the residual stream's gradient carried through (sequential or
// parallel residual, one or two input norms). Only activation gradients are formed; no weight
// gradient is ever computed. Every matrix product is a BLAS gemm (sgemm in FP32, dgemm in FP64) on
// the [out, in] row-major weights: forward Y = X·Wᵀ, backward dX = dY·W. No branch names an
// architecture; every branch reads a DecoderSpec field.
//
// "Keys" and "values" are exactly what the KV cache stores before any position enters and what
// KVQuant quantizes (and what an ActivationObserver's on_kv sees): K = k_proj(h) (+ bias), after
// the per-head QK-norm when the spec has one, before RoPE; V = v_proj(h) (+ bias). Under ALiBi and
// learned positions keys are never rotated, so K is the cached key itself.
//
// Loss: L = −1/(n−1) · Σ_{t=0}^{n−2} log softmax(logits[t])[tokens[t+1]], the mean next-token NLL of
// one window of n tokens at positions 0 … n−1 (the llama2.c / HF convention; the last position's
// logits are not part of L). Consequences: the last token's K and V (every layer) only reach the
// last position's logits, so their gradients are exactly zero; K/V of token t reach positions ≥ t.
//
// Mixture of experts: the top-k choice of experts is piecewise constant in the activations, so the
// gradient is that of the selected experts' outputs and of their routing weights (router softmax
// renormalized over the top k) with the selection held fixed — the derivative wherever it exists.
// A finite-difference check must use perturbations small enough not to change any token's top-k
// set (tests/decoder_backward_test.cpp checks that the selection is unchanged).
//
// Scalar type T is float (the calibration path) or double (finite-difference checks, where the
// loss must be accurate to ~1e−13 for a difference quotient to resolve 1e−7-sized gradients).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/decoder.h"

namespace sq {

/// Which KV-cache tensor of a layer.
enum class KVTensor { Key, Value };

/// One K/V activation element changed by `delta` inside the forward pass, right where the cache
/// would receive it (the key after the projection and QK-norm, before RoPE; the value as the
/// projection produced it) — the hook finite-difference gradient checks use. The stored K/V and
/// everything downstream see the perturbed value.
struct KVPerturbation {
  int layer = 0;
  KVTensor tensor = KVTensor::Key;
  int64_t token = 0;    ///< row in [0, n)
  int64_t channel = 0;  ///< column in [0, n_kv_heads·head_dim)
  double delta = 0.0;
};

/// Keys/values of one layer and the loss gradients with respect to them; all [n, n_kv_heads·head_dim]
/// row-major (channel = kv_head·head_dim + i, as the k/v projections' output rows).
template <typename T>
struct KVLayerGradients {
  std::vector<T> keys;      ///< K before RoPE, after QK-norm (the forward activations; an ActivationObserver's on_kv keys)
  std::vector<T> values;    ///< V
  std::vector<T> d_keys;    ///< ∂L/∂K (that same K)
  std::vector<T> d_values;  ///< ∂L/∂V
};

/// The result of one forward + backward pass over a window.
template <typename T>
struct BasicKVGradients {
  double loss = 0.0;   ///< mean next-token NLL (nats) of the window, see the file comment
  int64_t tokens = 0;  ///< n
  int64_t width = 0;   ///< n_kv_heads·head_dim
  std::vector<KVLayerGradients<T>> layers;  ///< [n_layers]
};
using KVGradients = BasicKVGradients<float>;

/// Forward pass with saved activations and reverse-mode K/V gradients for one FP32 Decoder of any
/// DecoderSpec, evaluated in scalar type T (float or double). The model must outlive this object (float reads
/// its weights in place; double keeps a widened copy, 2× the model's FP32 size).
/// Thread-safe: the const methods allocate their own buffers, so several windows may run
/// concurrently on one instance. Inside an OpenMP parallel region the attention runs serially.
template <typename T>
class DecoderKVBackward {
 public:
  /// Throws UnsupportedError when a projection (router and experts included) or the LM head is not
  /// a DenseLinear, or the token embedding is stored quantized: the gradients need the FP32 model (load the original checkpoint).
  explicit DecoderKVBackward(const Decoder& model);
  ~DecoderKVBackward();
  DecoderKVBackward(const DecoderKVBackward&) = delete;
  DecoderKVBackward& operator=(const DecoderKVBackward&) = delete;

  /// Forward only: the loss L of tokens[0..n) (see the file comment), with `perturbation` applied
  /// when given. `logits`, when given, receives [n, vocab] row-major logits of every position.
  /// Throws std::invalid_argument for n < 2 or n above the model's context, or a perturbation
  /// outside [n_layers] × [n] × [width]; std::out_of_range for a token id outside the vocabulary.
  double loss(const int32_t* tokens, int64_t n, const KVPerturbation* perturbation = nullptr,
              std::vector<T>* logits = nullptr) const;

  /// Forward + backward: the loss and, per layer, K (pre-RoPE), V, ∂L/∂K, ∂L/∂V. Throws as loss().
  /// (The backward stops at layer 0's K and V: nothing below them needs a gradient.)
  BasicKVGradients<T> gradients(const int32_t* tokens, int64_t n) const;

 private:
  struct Weights;
  struct Tape;
  void forward(const int32_t* tokens, int64_t n, const KVPerturbation* perturbation, Tape& tape) const;
  const Decoder& model_;
  std::unique_ptr<Weights> w_;
};

extern template class DecoderKVBackward<float>;
extern template class DecoderKVBackward<double>;

/// Convenience: DecoderKVBackward<float>(model).gradients(tokens, n). Throws as the class does.
KVGradients kv_gradients(const Decoder& model, const int32_t* tokens, int64_t n);

}  // namespace sq
