// The LLaMA decoder's ops on a CUDA device (FP32 activations), mirroring lib/ops/ops.h and the
// attention of Decoder (model/decoder.cpp) so each can be tested against the CPU reference.
//
// One header declares every op; cuda_ops.cu implements them with CUDA kernels and cuBLAS, and
// cuda_stub.cpp (builds without CUDA) with functions that throw UnsupportedError.
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
/// reduction in FP32 (the CPU sums sequentially, so results differ by rounding only).
void rms_norm(const float* x, const float* w, float* y, int64_t n, int d, float eps, Stream stream = {});

/// Rotary position embedding (Su et al. 2021, RoFormer Eq. 34), as ops::rope, in place on
/// x [n, n_heads·head_dim]: pair i of every head of row t is rotated by positions[t] · inv_freq[i];
/// pairs are (2i, 2i+1) for Interleaved and (i, i + head_dim/2) for HalfSplit. `inv_freq`
/// [head_dim/2] is a HOST array (rope_inv_freq of the model config, core/rope_frequencies.h: θ and
/// RoPE scaling), passed to the kernel by value, so the angles are bit-identical to the CPU's;
/// only cosf/sinf differ (CUDA: ≤ 2 ulp over the full range). `positions` [n] (device int32) may be
/// any integers, negative included: rotating pre-RoPE cached keys on the fly uses their cache
/// positions, and rotating by a negative delta undoes a rotation.
/// Throws std::invalid_argument for an odd head_dim or one above 512.
void rope(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, const float* inv_freq, RopeLayout layout,
          Stream stream = {});

/// Plain RoPE with base `theta` (no scaling): the overload above with
/// inv_freq = rope_inv_freq<float>(theta, head_dim, RopeScaling{}) (tests, benchmarks).
void rope(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, float theta, RopeLayout layout,
          Stream stream = {});

/// SwiGLU gate (Shazeer 2020), as ops::swiglu: gate[i] = gate[i] / (1 + exp(−gate[i])) · up[i], in
/// place on gate; both [count].
void swiglu(float* gate, const float* up, int64_t count, Stream stream = {});

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
/// a row of NaN (callers check ids on the host, as CudaLlamaModel does).
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

/// Per-token symmetric INT8 activation quantization (SmoothQuant Eq. 3.1, ActQuant::PerToken), as
/// quantize_activations(…, PerToken, …): scales[i] = Δ_i = absmax(x[i, :]) / 127 (1.0 for an
/// all-zero row), q[i, j] = clamp(round_half_even(x[i, j] / Δ_i), −127, 127); NaN maps to −127 as
/// on the CPU. x: [n, k] FP32; q: [n, k] INT8; scales: [n] FP32. IEEE division and rintf, so the
/// result is bit-identical to the CPU's.
void quantize_per_token_int8(const float* x, int64_t n, int64_t k, int8_t* q, float* scales, Stream stream = {});

}  // namespace sq::cuda
