// Hooks that let calibration observe the activations of a forward pass.
#pragma once

#include <cstdint>

namespace sq {

/// Where in a decoder layer an activation is observed. Linears that share an input share a site.
enum class ActivationSite : int {
  AttnInput = 0,   ///< RMSNorm output feeding q_proj, k_proj, v_proj   [n, dim]
  AttnOutput = 1,  ///< attention output feeding o_proj                  [n, n_heads*head_dim]
  FfnInput = 2,    ///< RMSNorm output feeding gate_proj, up_proj        [n, dim]
  FfnHidden = 3,   ///< silu(gate)*up feeding down_proj                  [n, hidden_dim]
                   ///< (mixture of experts: one call per expert with the m rows routed to it,
                   ///< so statistics pool every expert's down_proj input)
};
inline constexpr int kActivationSites = 4;
/// "attn_input", "attn_output", "ffn_input", "ffn_hidden" (HDF5 group names, docs/formats.md).
inline const char* activation_site_name(ActivationSite site) {
  static const char* names[kActivationSites] = {"attn_input", "attn_output", "ffn_input", "ffn_hidden"};
  return names[static_cast<int>(site)];
}

/// The seven projections of a decoder layer, in a fixed order.
enum class Projection : int { Q = 0, K, V, O, Gate, Up, Down };
inline constexpr int kProjections = 7;
/// "q_proj", "k_proj", ... (canonical tensor-name component).
inline const char* projection_name(Projection p) {
  static const char* names[kProjections] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return names[static_cast<int>(p)];
}
/// The input site of a projection (Q/K/V → AttnInput, O → AttnOutput, Gate/Up → FfnInput, Down → FfnHidden).
inline ActivationSite projection_input_site(Projection p) {
  static const ActivationSite sites[kProjections] = {ActivationSite::AttnInput, ActivationSite::AttnInput,
                                                      ActivationSite::AttnInput, ActivationSite::AttnOutput,
                                                      ActivationSite::FfnInput,  ActivationSite::FfnInput,
                                                      ActivationSite::FfnHidden};
  return sites[static_cast<int>(p)];
}

/// Receives activations during Decoder::forward (called on the forwarding thread, in layer
/// order; pointers are valid only during the call). All tensors are row-major [n, width].
class ActivationObserver {
 public:
  virtual ~ActivationObserver() = default;
  /// Input of the linears at `site` of `layer`.
  virtual void on_linear_input(int layer, ActivationSite site, const float* x, int64_t n, int64_t width) {}
  /// Output of projection `p` of `layer` (before any residual add).
  virtual void on_linear_output(int layer, Projection p, const float* y, int64_t n, int64_t width) {}
  /// Keys before RoPE and values of `layer`: [n, n_kv_heads*head_dim] each.
  virtual void on_kv(int layer, const float* k_pre_rope, const float* v, int64_t n, int64_t width) {}
};

}  // namespace sq
