// Per-pair inverse frequencies of rotary position embedding (RoPE), with frequency scaling.
//
// Every RoPE user (CPU forward and backward, KV caches that rotate keys after reading, the CUDA
// backend, calibration, benchmarks) takes its inverse frequencies from here, so a model config's
// θ and scaling are applied once and identically everywhere.
#pragma once

#include <vector>

#include "core/model_config.h"

namespace sq {

/// inv_freq[i] for the head_dim/2 rotation pairs i of RoPE with base `theta` and `scaling`:
/// pair i of a token at position p is rotated by the angle p · inv_freq[i].
///
///  * Default (Su et al. 2021, RoFormer Eq. 15): inv_freq[i] = 1 / θ^(2i/d), d = head_dim.
///  * Linear (position interpolation, Chen et al. 2023): inv_freq[i] = θ^(−2i/d) / factor, i.e.
///    positions divided by factor.
///  * Llama3 (Llama 3.1, Meta 2024; transformers' `_compute_llama3_parameters`): with
///    wavelen = 2π / inv, L = original_max_position_embeddings, lo = low_freq_factor,
///    hi = high_freq_factor: wavelen < L/hi keeps inv; wavelen > L/lo gives inv / factor;
///    in between, s = (L / wavelen − lo) / (hi − lo) and inv ← (1 − s) · inv / factor + s · inv.
///
/// Arithmetic follows transformers' FP32 tensor expressions operation by operation when T = float
/// (the Default case is the exact expression ops::rope has always used), and runs in double when
/// T = double (the FP64 backward pass). All three types have transformers' attention_factor 1, so
/// nothing but the angles changes. Precondition: head_dim even and positive, theta > 0, the
/// scaling valid (ModelConfig::validate); returns an empty vector for head_dim < 2.
template <typename T>
std::vector<T> rope_inv_freq(float theta, int head_dim, const RopeScaling& scaling);

/// rope_inv_freq<float>(c.rope_theta, c.rope_dim(), c.rope_scaling): [rope_dim/2], the
/// frequencies of the model's global layers (every layer of a model without rope_local_theta).
std::vector<float> rope_inv_freq(const ModelConfig& c);

/// The frequencies of layer `layer`: a sliding-window layer (c.window(layer) > 0) of a model with
/// spec.rope_local_theta > 0 uses that base without scaling (Gemma 3's local layers), every other
/// layer rope_inv_freq(c). Empty when the model has no RoPE (ALiBi, learned positions).
std::vector<float> rope_inv_freq(const ModelConfig& c, int layer);
/// The same per-layer choice of base and scaling, evaluated in T (double: the FP64 backward pass);
/// rope_inv_freq<float>(c, layer) == rope_inv_freq(c, layer).
template <typename T>
std::vector<T> rope_inv_freq(const ModelConfig& c, int layer);

}  // namespace sq
