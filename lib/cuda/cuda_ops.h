// The decoder's ops on a CUDA device (FP32 activations), mirroring lib/ops/ops.h and the attention
// of Decoder (model/decoder.cpp) so each can be tested against the CPU reference: the LLaMA ops
// (rms_norm, rope, swiglu, attention, ...) and what the generic decoder of every DecoderSpec needs
// on top (norm with LayerNorm and biases, activation / gated_activation for every Activation,
// partial rotary rope, attention with AttentionOptions: scale, sliding window, ALiBi; the MoE row
// helpers gather_rows / scatter_add_rows / fill).
//
// One header declares every op; cuda_ops.cu implements them with CUDA kernels and cuBLAS, and
// cuda_stub.cpp (builds without CUDA) with functions that throw UnsupportedError. The element math
// of the generic ops (norm elements, activations, attention scores, MoE accumulation) is in
// cuda/decoder_element.h, compiled for the host too and tested on the CPU against lib/ops.
//
// Conventions: every pointer argument is DEVICE memory (cudaMalloc, e.g. DeviceArray::data());
// activations are row-major [n_tokens, width] as on the CPU; ops are enqueued on `stream` and return
// without waiting (call cuda_synchronize / CudaStream::synchronize before reading results on the
// host). A launch failure throws CudaError naming the op; an asynchronous kernel fault surfaces at
// the next synchronization. Shapes are checked on the host (std::invalid_argument for negative or
// inconsistent sizes); device data (token ids, positions) is not, see each op.
#pragma once

#include <cstdint>

#include "core/model_config.h"
#include "cuda/cuda_runtime.h"

namespace sq::cuda {

/// RMSNorm (Zhang & Sennrich 2019), as ops::rms_norm: y[t, j] = x[t, j] / sqrt(mean_j x[t, j]² + eps) · w[j].
/// x, y: [n, d] (may alias); w: [d]. One thread block per row; the sum of squares is a tree
/// reduction in FP32 (the CPU sums sequentially, so results differ by rounding only). The same as
/// norm(NormKind::RMSNorm, x, w, nullptr, y, n, d, eps).
void rms_norm(const float* x, const float* w, float* y, int64_t n, int d, float eps, Stream stream = {});

/// The decoder's normalization, as ops::norm (core/model_config.h NormKind), over each row of x [n, d]
/// (y [n, d] may alias x; w [d]; b [d] or nullptr):
///   RMSNorm:   y = x · inv · w, inv = 1 / sqrt(Σ x² / d + eps) (b ignored);
///   LayerNorm (Ba et al. 2016): y = (x − μ) · inv · w + b, inv = 1 / sqrt(σ² + eps), with μ and the
///              population variance σ² computed as ops::layer_norm does: two passes in double
///              (mean, then the mean squared deviation), μ and inv rounded to FP32 once; b = nullptr
///              adds 0 (no bias, MPT's `no_bias`).
/// One thread block per row; the row sums are block reductions (FP32 sum of squares for RMSNorm,
/// double for LayerNorm) in a different order from the CPU's sequential sums. The per-element
/// expressions are cuda/decoder_element.h's (bit-identical to the CPU's given the same row factors;
/// LayerNorm's double-precision factors almost always round to the CPU's). Throws
/// std::invalid_argument for negative sizes.
void norm(NormKind kind, const float* x, const float* w, const float* b, float* y, int64_t n, int d, float eps,
          Stream stream = {});

/// Rotary position embedding (Su et al. 2021, RoFormer Eq. 34), as ops::rope, in place on
/// x [n, n_heads·head_dim]: pair i of every head of row t is rotated by positions[t] · inv_freq[i];
/// pairs are (2i, 2i+1) for Interleaved and (i, i + head_dim/2) for HalfSplit. `inv_freq`
/// [head_dim/2] is a HOST array (rope_inv_freq of the model config, core/rope_frequencies.h: θ and
/// RoPE scaling), passed to the kernel by value, so the angles are bit-identical to the CPU's;
/// only cosf/sinf differ (CUDA: ≤ 2 ulp over the full range). `positions` [n] (device int32) may be
/// any integers, negative included: rotating pre-RoPE cached keys on the fly uses their cache
/// positions, and rotating by a negative delta undoes a rotation.
/// Throws std::invalid_argument for an odd head_dim or one above 1024.
void rope(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, const float* inv_freq, RopeLayout layout,
          Stream stream = {});

/// Partial rotary embedding, as ops::rope's rot_dim overload (GPT-NeoX `rotary_pct`, Phi
/// `partial_rotary_factor`): in place on x [n, n_heads·head_dim], pair i < rot_dim/2 of every head
/// of row t is rotated by positions[t] · inv_freq[i], the pairs being (2i, 2i+1) (Interleaved) or
/// (i, i + rot_dim/2) (HalfSplit) inside the head's first rot_dim channels; channels rot_dim …
/// head_dim−1 are left unchanged. `inv_freq` [rot_dim/2] is a HOST array (rope_inv_freq(config,
/// layer)), passed to the kernel by value; the angles are bit-identical to the CPU's, cosf/sinf ≤ 2
/// ulp. rot_dim = head_dim is the overload below; rot_dim = 0 does nothing. `positions` [n] device
/// int32, any integers (negative undo a rotation). Throws std::invalid_argument unless head_dim is
/// even and ≤ 1024 and rot_dim is even with 0 ≤ rot_dim ≤ head_dim.
void rope(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, int rot_dim, const float* inv_freq,
          RopeLayout layout, Stream stream = {});

/// Plain RoPE with base `theta` (no scaling): the overload above with
/// inv_freq = rope_inv_freq<float>(theta, head_dim, RopeScaling{}) (tests, benchmarks).
void rope(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, float theta, RopeLayout layout,
          Stream stream = {});

/// SwiGLU gate (Shazeer 2020), as ops::swiglu: gate[i] = gate[i] / (1 + exp(−gate[i])) · up[i], in
/// place on gate; both [count]. gated_activation(Activation::SiLU, ...): bit-identical to the CPU
/// (the exponential is ops::fast_exp's polynomial, cuda/decoder_element.h).
void swiglu(float* gate, const float* up, int64_t count, Stream stream = {});

/// The activation `act` in place on x [count], as ops::activation: SiLU x·σ(x); GeluTanh (the
/// `gelu_new` tanh approximation, computed as ops does through σ(2v)); Gelu 0.5·x·(1 + erf(x/√2));
/// ReLU max(x, 0). Element functions of cuda/decoder_element.h: SiLU, GeluTanh and ReLU are
/// bit-identical to the CPU (same fast_exp polynomial, same operation order and the fused
/// multiply-adds g++ forms in the default -march=native build with FMA); Gelu uses erff
/// (≤ 2 ulp; glibc's erff ≤ 1 ulp), so it differs by ≤ 0.5·|x|·3·2^−23 + 2 ulp. Throws
/// std::invalid_argument for a negative count.
void activation(Activation act, float* x, int64_t count, Stream stream = {});

/// Gated activation in place on `gate`, as ops::gated_activation: gate[i] = act(gate[i]) · up[i]
/// (SwiGLU for SiLU, GeGLU for the GELUs; Shazeer 2020); both [count]. Accuracy as activation().
void gated_activation(Activation act, float* gate, const float* up, int64_t count, Stream stream = {});

/// out[i] += x[i] for i < count (residual connection).
void add_inplace(float* out, const float* x, int64_t count, Stream stream = {});

/// Row-wise numerically stable softmax with a causal prefix, in place on x [rows, cols]: row i
/// normalizes its first v_i = min(cols, visible0 + i) entries (softmax(s)_j = exp(s_j − max) / Σ)
/// and sets entries [v_i, cols) to 0. visible0 = cols gives a plain row-wise softmax; for n new
/// queries after p0 cached tokens, visible0 = p0 + 1 gives the causal mask of Decoder's attention.
/// Throws std::invalid_argument unless visible0 ≥ 1.
void softmax_rows(float* x, int64_t rows, int64_t cols, int64_t visible0, Stream stream = {});

/// Embedding gather: out[t, :] = table[tokens[t], :] for t < n; table [vocab, dim], out [n, dim].
/// Token ids live on the device and are not range-checked there: a token outside [0, vocab) yields
/// a row of NaN (callers check ids on the host, as CudaDecoder does).
void embedding(const float* table, int64_t vocab, int dim, const int32_t* tokens, int64_t n, float* out,
               Stream stream = {});

/// FP32 linear y = x · Wᵀ + b through cuBLAS sgemm (FP32 math; TF32 disabled, so results agree with
/// OpenBLAS up to summation order). x: [n, k] row-major; W: [m, k] row-major (nn.Linear layout);
/// bias: [m] or nullptr; y: [n, m] row-major (must not alias x). Used for every projection and the
/// LM head of the FP32 runner. Throws CudaError when cuBLAS fails.
void linear_f32(const float* x, int64_t n, int64_t k, const float* W, int64_t m, const float* bias, float* y,
                Stream stream = {});

/// Causal grouped-query attention of n new queries at positions p0 … p0+n−1 over cache rows
/// 0 … p0+n−1, as Decoder::attention (prefill: n > 1; decode: n == 1):
///   S[i, j] = q_h[i] · k_g[j] / sqrt(head_dim) for j ≤ p0 + i,   out_h[i] = softmax(S[i]) · V_g,
/// where query head h reads KV head g = h / (n_heads / n_kv_heads). q, out: [n, n_heads·head_dim];
/// keys, values: [p0 + n, n_kv_heads·head_dim] (FP32, keys already rotated). One thread block per
/// (query, head) with head_dim threads; keys are visited in tiles of head_dim with an online
/// (running max, rescaled sum) softmax, so memory does not grow with the context. Exponentials are
/// expf (CPU: ops::fast_exp, relative error ≤ 2e−7). Throws std::invalid_argument unless
/// 0 < head_dim ≤ 1024 and n_heads is a multiple of n_kv_heads.
void attention(const float* q, const float* keys, const float* values, int64_t n, int64_t p0, int n_heads,
               int n_kv_heads, int head_dim, float* out, Stream stream = {});

/// What makes a layer's attention differ from plain causal softmax(q·kᵀ/√d)·v (Decoder::attention).
struct AttentionOptions {
  float scale = 0.0f;                  ///< softmax scale; 0 = 1/sqrt(head_dim)
  int window = 0;                      ///< sliding window: query at position p sees keys j with p − window < j ≤ p; 0 = all
  const float* alibi_slopes = nullptr; ///< DEVICE [n_heads] ALiBi slopes: score −= slope_h·(p − j); nullptr = none
  bool plain() const { return scale == 0.0f && window == 0 && alibi_slopes == nullptr; }
};

/// attention() with a layer's options, as Decoder::attention without block eviction: query i (of n)
/// sits at cache position p = p0 + i and sees keys j with lo(p) ≤ j ≤ p, lo(p) = max(0, p − window
/// + 1) when opt.window > 0, else 0; its score for key j is
///   S = scale · (q_h · k_g[j]) − slope_h · float(p − j)
/// (scale = opt.scale, or 1/sqrt(head_dim) when opt.scale ≤ 0; the ALiBi term only when
/// opt.alibi_slopes is set, slope_h = opt.alibi_slopes[h]), out_h[i] = softmax(S) · V_g. Shapes,
/// layout, kernel and accuracy as the overload above (which is this one with default options,
/// bit for bit); the score expression and window rule are cuda/decoder_element.h's
/// attention_score / first_visible_key. Throws std::invalid_argument as the overload above, and for
/// a negative window.
void attention(const float* q, const float* keys, const float* values, int64_t n, int64_t p0, int n_heads,
               int n_kv_heads, int head_dim, float* out, const AttentionOptions& opt, Stream stream = {});

/// Per-token symmetric INT8 activation quantization (SmoothQuant Eq. 3.1, ActQuant::PerToken), as
/// quantize_activations(…, PerToken, …): scales[i] = Δ_i = absmax(x[i, :]) / 127 (1.0 for an
/// all-zero row), q[i, j] = clamp(round_half_even(x[i, j] / Δ_i), −127, 127); NaN maps to −127 as
/// on the CPU. x: [n, k] FP32; q: [n, k] INT8; scales: [n] FP32. IEEE division and rintf, so the
/// result is bit-identical to the CPU's.
void quantize_per_token_int8(const float* x, int64_t n, int64_t k, int8_t* q, float* scales, Stream stream = {});

/// Row gather (mixture of experts: the rows routed to one expert): out[i, :] = x[rows[i], :] for
/// i < m. x: [*, d]; rows: [m] device int32 (not range-checked on the device: every rows[i] must be
/// a row of x); out: [m, d] (must not alias x). Exact copies. Throws std::invalid_argument for
/// negative sizes.
void gather_rows(const float* x, const int32_t* rows, int64_t m, int d, float* out, Stream stream = {});

/// Weighted row scatter-add (mixture of experts: an expert's outputs back into the token rows):
/// y[rows[i], j] += src[i, j] · weights[i] for i < m, j < d, with the float expression of
/// Decoder's MoE (y += src·w, which g++ compiles to fma(src, w, y): cuda/decoder_element.h
/// weighted_add), so the result is bit-identical to the CPU's accumulation in the same expert
/// order. y: [*, d]; src: [m, d];
/// rows, weights: [m] device (int32, FP32). rows must be distinct within one call (no atomics);
/// not range-checked on the device. Throws std::invalid_argument for negative sizes.
void scatter_add_rows(float* y, const float* src, const int32_t* rows, const float* weights, int64_t m, int d,
                      Stream stream = {});

/// x[i] = value for i < count. Throws std::invalid_argument for a negative count.
void fill(float* x, int64_t count, float value, Stream stream = {});

}  // namespace sq::cuda
