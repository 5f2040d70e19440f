// Device-neutral elementwise and normalization ops of the LLaMA decoder (FP32, CPU).
//
// Layout convention: activations are row-major [n_tokens, width] (one token per row).
#pragma once

#include <cstdint>

#include "core/model_config.h"

namespace sq::ops {

/// RMSNorm (Zhang & Sennrich 2019), as in LLaMA: y[t, j] = x[t, j] / sqrt(mean_j x[t, j]^2 + eps) * w[j].
/// x, y: [n, d] (may alias); w: [d].
void rms_norm(const float* x, const float* w, float* y, int64_t n, int d, float eps);

/// Rotary position embedding (Su et al. 2021) applied in place to `x` [n, n_heads * head_dim].
/// Row t has position positions[t]. Pair i (i < head_dim/2) is rotated by the angle
/// float(pos) * inv_freq[i] (inv_freq [head_dim/2], from rope_inv_freq in core/rope_frequencies.h,
/// which applies the model's θ and RoPE scaling); the channels forming pair i are (2i, 2i+1) for
/// Interleaved and (i, i + head_dim/2) for HalfSplit.
void rope(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, const float* inv_freq, RopeLayout layout);

/// Plain RoPE with base `theta` (no scaling): the overload above with
/// inv_freq = rope_inv_freq<float>(theta, head_dim, RopeScaling{}). Model code passes the config's
/// frequencies instead; this form is for tests and synthetic benchmarks of unscaled RoPE.
void rope(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, float theta, RopeLayout layout);

/// SwiGLU gate (Shazeer 2020): gate[i] = silu(gate[i]) * up[i] = gate/(1+exp(-gate)) * up, in place
/// on `gate`; both [count].
void swiglu(float* gate, const float* up, int64_t count);

/// out[i] += x[i] for i < count (residual connection).
void add_inplace(float* out, const float* x, int64_t count);

/// Numerically stable in-place softmax of one row of `count` scores.
void softmax_row(float* x, int count);

/// log-sum-exp of one row (double accumulation), i.e. log sum_i exp(x[i]).
double log_sum_exp(const float* x, int count);

}  // namespace sq::ops
