// The parts of a decoder layer as the DecoderSpec implies them: every linear (canonical base name,
// shape, bias, the activation site it reads, how to reach it in a DecoderLayer) and every other
// tensor (norm weights and biases, QK-norm, post norms; globals: embedding norm, learned positions,
// final norm bias). Decoder::from_checkpoint, the .sqm reader (model/sqm_model.h) and sq-convert's
// recipe steps (calib/recipe.h) all enumerate a layer from here, so none of them lists projections
// by hand and an architecture feature added to DecoderSpec is added once, here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/model_config.h"
#include "core/tensor.h"
#include "model/decoder.h"
#include "model/linear.h"
#include "model/observer.h"

namespace sq {

/// Which member of a DecoderLayer a linear is.
enum class LinearRole { Q, K, V, O, Gate, Up, Down, Router, ExpertGate, ExpertUp, ExpertDown };

/// One linear of decoder layer `layer`.
struct LinearSlot {
  LinearRole role = LinearRole::Q;
  int layer = 0;
  int expert = -1;           ///< expert index for Expert* roles, else −1
  std::string name;          ///< canonical base name (core/checkpoint.h) without ".weight"/".bias"
  int64_t out = 0, in = 0;   ///< nn.Linear shape [out, in]
  bool bias = false;         ///< has "<name>.bias" [out]
  ActivationSite site = ActivationSite::AttnInput;  ///< the activation it reads (calibration statistics, Hessians, reorders)
  /// False for linears every scheme keeps in FP32: the MoE router (its logits pick experts; a few
  /// of its 8-bit or 4-bit rounding errors would re-route tokens, and it is tiny: n_experts × dim).
  bool quantize = true;
  /// The Projection its outputs are observed as (ActivationObserver::on_linear_output; expert
  /// linears map onto Gate/Up/Down), used for the per-projection statistics of the LLaMA set.
  Projection projection() const;
};

/// The linears of layer `l` in a fixed order: q, k, v, o; then gate, up, down (plain MLP: up =
/// fc1, down = fc2, no gate); or, with experts, the router, then expert 0's gate, up, down, expert
/// 1's, … For the LLaMA structure this is the kProjections order.
std::vector<LinearSlot> decoder_layer_linears(const ModelConfig& c, int l);

/// The pointer holding `s` in `L` (resizes L.experts to the model's n_experts for expert roles).
std::unique_ptr<Linear>& linear_slot(DecoderLayer& L, const LinearSlot& s);
/// The linear `s` of `L`, or nullptr when unset.
const Linear* linear_of(const DecoderLayer& L, const LinearSlot& s);

/// Sets DenseLinear::set_prepack(on) on every dense linear of layer `L` (layer `l` of a model with
/// config `c`); quantized linears are left alone. Call before the layer's first multi-row forward.
void set_layer_prepack(const ModelConfig& c, int l, DecoderLayer& L, bool on);
/// set_layer_prepack on every layer of `model`, and on its LM head when that is dense.
void set_model_prepack(Decoder& model, bool on);
/// Bytes of the FP32 weights of `model`'s dense linears (every layer's and the LM head): what their
/// packed copies (model/linear.h) would add to the resident set.
int64_t dense_linear_bytes(const Decoder& model);

/// A non-linear tensor of a layer (1-D: norm weights/biases, QK-norm weights).
struct LayerTensorSlot {
  std::string name;           ///< canonical name
  int64_t size = 0;           ///< [size]
  Tensor DecoderLayer::*field = nullptr;
};
/// The layer's non-linear tensors in a fixed order: input norm weight, FFN norm weight (absent
/// with a shared input norm), then input/FFN norm biases, q/k norms, post-attention norm
/// (+bias), post-FFN norm (+bias). For the LLaMA structure: input_layernorm, post_attention_layernorm.
std::vector<LayerTensorSlot> decoder_layer_tensors(const ModelConfig& c, int l);

/// A tensor outside the layers other than the token embedding, the final norm weight and the head.
struct GlobalTensorSlot {
  std::string name;
  std::vector<int64_t> shape;
  Tensor DecoderGlobals::*field = nullptr;
};
/// Embedding norm weight/bias, learned position table, final norm bias, as the spec implies (none for LLaMA).
std::vector<GlobalTensorSlot> decoder_global_tensors(const ModelConfig& c);

/// Where a decoder's weights come from (a checkpoint of FP32 tensors, a packed .sqm file, …).
/// Decoder layers and globals are built from any source by build_decoder_layer / _globals.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  /// The FP32 tensor `name` of shape `shape`; throws InputError naming the source and tensor when
  /// it is missing or mis-shaped.
  virtual Tensor tensor(const std::string& name, const std::vector<int64_t>& shape) const = 0;
  /// The linear `s` (dense or quantized, with its bias when s.bias); throws InputError likewise.
  virtual std::unique_ptr<Linear> linear(const LinearSlot& s) const = 0;
};

/// Layer `l` of a model with config `c`: every linear and tensor the spec implies, from `src`.
DecoderLayer build_decoder_layer(const ModelConfig& c, int l, const WeightSource& src);
/// The DecoderGlobals of `c` from `src`.
DecoderGlobals build_decoder_globals(const ModelConfig& c, const WeightSource& src);
/// A copy of `L`'s non-linear tensors (shared storage) with no linears set: the frame a converter
/// fills with quantized linears (linear_slot) to run the converted layer.
DecoderLayer copy_layer_tensors(const ModelConfig& c, int l, const DecoderLayer& L);

}  // namespace sq
