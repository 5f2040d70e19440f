// Real inputs and weights for the linear-layer tests of the CUDA backend, from the shared
// stories260K model (dim 64, hidden 172): activations a real decoder feeds its projections.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace sq::test {

/// Real activations and weights of stories260K layer 0 for `n` tokens of a TinyStories sentence
/// (token ids repeat cyclically when n exceeds the sentence).
struct StoriesLinearInputs {
  int64_t n = 0;
  std::vector<float> x64;   ///< [n, 64]: RMSNorm(embedding) — the input of q/k/v and gate/up
  std::vector<float> x172;  ///< [n, 172]: SwiGLU(gate·x64, up·x64) — the input of down_proj
  Tensor wq;                ///< q_proj weight [64, 64]
  Tensor wgate;             ///< gate_proj weight [172, 64]
  Tensor wdown;             ///< down_proj weight [64, 172]
  Tensor whead;             ///< LM head weight [512, 64]
};

/// One of those weights and the activations it reads (pointers into a StoriesLinearInputs).
struct WeightAndInput {
  const Tensor* w;
  const std::vector<float>* x;
};

/// Loads stories260K (test_data.h paths) and computes the inputs for n tokens (n ≥ 1).
StoriesLinearInputs stories_linear_inputs(int64_t n);

}  // namespace sq::test
