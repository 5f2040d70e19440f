// Recipe step "transform: Hadamard rotation" (calib/recipe.h; sq-convert --rotate hadamard), after
// smoothing, for every architecture (the roles and sites of model/decoder_linears.h):
//
//   online, at the input of every quantized linear (QuaRot, Ashkboos et al. 2024, §3; SpinQuant's R4
//     at the down projection): every linear reading site S (q/k/v at the attention input, gate/up
//     (+ the MoE router) at the FFN input, down/fc2 at the FFN hidden activation) stores W·R_S, and
//     the runner rotates S once per forward before quantizing it (model/hadamard_input_linear.h;
//     the decoder rotates a shared input once for q/k/v and gate/up). A norm output or FFN hidden
//     activation holds a few channels 10–100× the rest, which set every per-token INT8 step;
//     rotated, each block of b channels shares them and the step shrinks.
//   offline, per attention head between v and o (QuaRot §3, SpinQuant's R2): W_v ← R·W_v on the rows
//     of each KV head (and b_v), W_o ← W_o·R on the columns of each query head. A head's attention
//     output is a weighted sum of its v rows, so it comes out rotated and o_proj's folded weight
//     undoes it: nothing runs online for o_proj. The value cache thus stores rotated values.
//   online, per head on queries and keys after RoPE (QuaRot §3; SpinQuant's R3): recorded as
//     "kv_keys" and applied by the runner only where the KV cache quantizes keys after RoPE
//     (Decoder::set_key_rotation): the cache then stores rotated keys, whose outlier channels are
//     spread over the head. No weight changes (it cancels in q·k).
//
// R_S = the block-diagonal Walsh–Hadamard rotation of ops/hadamard.h over S's width (blocks of its
// largest power-of-two divisor: SmolLM2's 576-wide residual gets 64-wide blocks, its 1,536-wide FFN
// hidden 512). Rotating the residual stream itself (QuaRot's R1, folded into the embedding and the
// norms) is not done: it needs norms without per-channel weights after the rotation, which Gemma's
// post-norms and every LayerNorm bias break; an online rotation at each input works for every
// architecture. All of it is a change of basis of FP32 weights before quantization: the FP32
// model's logits are unchanged up to FP32 rounding (tests/hf_tiny_convert_test.cpp). The header
// records it in quantization.rotation (formats/rotation_header.h).
#pragma once

#include <map>

#include <nlohmann/json.hpp>

#include "calib/recipe.h"

namespace sq {

class RotationStep {
 public:
  /// Enabled by ConvertOptions::rotate. Throws UsageError when the scheme's calibration data would
  /// describe the unrotated activations: W4A16 (Σx² importance, Hessians), W4A4 with outlier
  /// channels, GPTQ or --clip search (W4A4 with --outlier-channels 0 is QuaRot's W4A4), W8A8 with
  /// static (O3) activation steps, nuq KV tables (fitted to unrotated values).
  explicit RotationStep(const ConvertInputs& in);
  bool enabled() const { return enabled_; }
  /// Rotates layer w in place (w.tensors) and records the rotated sites and blocks in w.rotation.
  void apply(LayerWork& w) const;
  /// header quantization.rotation: {"method": "hadamard", "online": {site: block}, "offline":
  /// {"attn_output": block}, "kv_keys": block} (null when disabled).
  nlohmann::json describe() const;

 private:
  bool enabled_ = false;
  std::map<ActivationSite, int64_t> online_;  ///< R's block at each site rotated online
  int64_t head_block_ = 0;                    ///< R's block within a head (head_dim), v/o offline
};

}  // namespace sq
