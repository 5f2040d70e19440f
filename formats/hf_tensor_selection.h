// Which part of a Hugging Face checkpoint to load: the global tensors and a range of decoder
// layers. Shared by the architecture files' map_tensors (formats/hf_architecture.h) and
// HfCheckpointReader (formats/hf_checkpoint.h), so that a 7B-sized checkpoint can be widened to
// FP32 one layer at a time.
#pragma once

#include <climits>

namespace sq {

/// A part of a checkpoint's tensors, by their canonical names (core/checkpoint.h):
///  * the global tensors (`globals`): every tensor outside the decoder layers — token embedding,
///    final norm (+ bias), untied LM head, learned position table, embedding norm (+ bias);
///  * the decoder layers l with first_layer <= l < end_layer: every `model.layers.{l}.*` tensor.
/// end_layer = kToLastLayer runs to the model's last layer. Whether the layers exist is checked
/// by the reader that applies the selection (HfCheckpointReader::load), which knows the count.
struct HfTensorSelection {
  /// end_layer of a selection that runs to the last layer, whatever the model's layer count.
  static constexpr int kToLastLayer = INT_MAX;

  bool globals = true;
  int first_layer = 0;
  int end_layer = kToLastLayer;

  /// True when layer `l` is selected.
  bool layer(int l) const { return l >= first_layer && l < end_layer; }

  /// Every tensor: the globals and all layers (what load_hf_checkpoint loads).
  static HfTensorSelection all() { return {}; }
  /// Layer `l` alone, no globals. only_layer(kToLastLayer) selects nothing (and is out of range).
  static HfTensorSelection only_layer(int l) { return {false, l, l < kToLastLayer ? l + 1 : l}; }
  /// The global tensors alone, no layer.
  static HfTensorSelection only_globals() { return {true, 0, 0}; }
};

}  // namespace sq
