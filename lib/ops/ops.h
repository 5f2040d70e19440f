// Device-neutral elementwise and normalization ops of the decoder (FP32, CPU).
//
// Layout convention: activations are row-major [n_tokens, width] (one token per row).
#pragma once

#include <cstdint>

#include "core/model_config.h"

namespace sq::ops {

/// RMSNorm (Zhang & Sennrich 2019), as in LLaMA: y[t, j] = x[t, j] / sqrt(mean_j x[t, j]^2 + eps) * w[j].
/// x, y: [n, d] (may alias); w: [d].
void rms_norm(const float* x, const float* w, float* y, int64_t n, int d, float eps);

/// The factor rms_norm scales a row by: 1 / sqrt(mean(x[0..d)²) + eps), summed in the order
/// rms_norm sums (so code that needs the factor itself, the backward pass, gets the same bits).
float rms_inv(const float* x, int64_t d, float eps);

/// LayerNorm (Ba et al. 2016) over each row: y[t, j] = (x[t, j] − μ_t) / sqrt(σ²_t + eps) · w[j] + b[j]
/// with μ_t, σ²_t the mean and (biased) variance of row t. x, y: [n, d] (may alias); w: [d];
/// b: [d] or nullptr (no bias, as MPT's `no_bias`).
void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t n, int d, float eps);

/// The decoder's normalization (core/model_config.h NormKind): rms_norm (b ignored, must be null or
/// unused) or layer_norm. Shapes as above.
void norm(NormKind kind, const float* x, const float* w, const float* b, float* y, int64_t n, int d, float eps);

/// Residual add and the following norm in one pass over the rows: x += r, then y = norm(x) as
/// norm() computes it (same values as add_inplace followed by norm). x, r, y: [n, d]; y must not
/// alias x or r.
void add_norm(NormKind kind, float* x, const float* r, const float* w, const float* b, float* y, int64_t n, int d, float eps);

/// Partial rotary embedding: the overload below applied to the first `rot_dim` channels of every
/// head (GPT-NeoX `rotary_pct`, Phi `partial_rotary_factor`); inv_freq [rot_dim/2] (rope_inv_freq
/// with head_dim = rot_dim); pairs are (2i, 2i+1) or (i, i + rot_dim/2) inside those channels; the
/// other head_dim − rot_dim channels are left unchanged. rot_dim even, 0 < rot_dim ≤ head_dim.
void rope(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, int rot_dim, const float* inv_freq,
          RopeLayout layout);

/// Rotary position embedding (Su et al. 2021) applied in place to `x` [n, n_heads * head_dim].
/// Row t has position positions[t]. Pair i (i < head_dim/2) is rotated by the angle
/// float(pos) * inv_freq[i] (inv_freq [head_dim/2], from rope_inv_freq in core/rope_frequencies.h,
/// which applies the model's θ and RoPE scaling); the channels forming pair i are (2i, 2i+1) for
/// Interleaved and (i, i + head_dim/2) for HalfSplit.
void rope(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, const float* inv_freq, RopeLayout layout);

/// The angles of the rope() overloads as a table: cos_out[t·half + i] = cos(float(positions[t]) ·
/// inv_freq[i]), sin_out likewise, for t < n, i < half (both [n, half]). Rows that share positions
/// and frequencies (a layer's queries and keys; every layer with the same frequencies) rotate with
/// one table through rope_apply.
void rope_table(const int32_t* positions, int64_t n, int half, const float* inv_freq, float* cos_out, float* sin_out);

/// rope() with precomputed angles: rotates x [n, n_heads * head_dim] in place by the table of
/// rope_table (half = rot_dim / 2); identical results to rope() with the table's positions and
/// frequencies (the rotation is computed the same way, vectorized over the pairs of a head).
void rope_apply(float* x, int64_t n, int n_heads, int head_dim, int rot_dim, const float* cos_t, const float* sin_t, RopeLayout layout);

/// Plain RoPE with base `theta` (no scaling): the overload above with
/// inv_freq = rope_inv_freq<float>(theta, head_dim, RopeScaling{}). Model code passes the config's
/// frequencies instead; this form is for tests and synthetic benchmarks of unscaled RoPE.
void rope(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, float theta, RopeLayout layout);

/// SwiGLU gate (Shazeer 2020): gate[i] = silu(gate[i]) * up[i] = gate/(1+exp(-gate)) * up, in place
/// on `gate`; both [count].
void swiglu(float* gate, const float* up, int64_t count);

/// The activation `act` in place on x [count]: SiLU x·σ(x); GeluTanh 0.5·x·(1 + tanh(√(2/π)(x +
/// 0.044715·x³))) (Hendrycks & Gimpel 2016, transformers `gelu_new`/`gelu_pytorch_tanh`); Gelu
/// 0.5·x·(1 + erf(x/√2)); ReLU max(x, 0).
void activation(Activation act, float* x, int64_t count);

/// Gated activation in place on `gate`: gate[i] = act(gate[i]) · up[i] (SwiGLU for SiLU, GeGLU for
/// the GELUs; Shazeer 2020). Both [count]. SiLU is exactly swiglu().
void gated_activation(Activation act, float* gate, const float* up, int64_t count);

/// out[i] += x[i] for i < count (residual connection).
void add_inplace(float* out, const float* x, int64_t count);

/// Numerically stable in-place softmax of one row of `count` scores (count ≥ 1).
void softmax_row(float* x, int count);

/// softmax_row without the division: x[i] = exp(x[i] − max x) in place, returns Σ x[i] (≥ 1).
/// Attention divides its P·V output rows by the sum instead of every probability.
float exp_shifted_row(float* x, int count);

/// exp_shifted_row with the shift given: x[i] = exp(x[i] − m) in place, returns Σ x[i]. For a
/// softmax over several pieces (block streaming's sinks and window rows), m = their common maximum
/// (every x[i] ≤ m, or the terms may overflow).
float exp_shifted_row(float* x, int count, float m);

/// The largest of x[0 … count−1] (count ≥ 1), over 16 lanes.
float max_element(const float* x, int count);

/// log-sum-exp of one row (double accumulation), i.e. log sum_i exp(x[i]).
double log_sum_exp(const float* x, int count);

}  // namespace sq::ops
