// Layer-major evaluation (issue 37): a model read one decoder layer at a time (model/layer_stream.h)
// runs every chunk of a group through layer 0, then every chunk through layer 1, …, so that each
// layer is read from disk once per group and memory holds one layer, the model's global tensors
// and the group's hidden states, not the model. The per-chunk forward is the one of
// Decoder::forward (embed, forward_layer for each layer with a fresh FP32 KV cache, final norm and
// LM head on the scored rows), so the logits equal a resident model's up to the FP32 rounding of
// GEMMs on plain instead of packed weights (bit-identical on the same kernels, model/linear.h).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/decoder.h"
#include "model/layer_stream.h"

namespace sq {

/// The tail logits of a group of equal-length inputs, computed layer-major from a LayerStream.
class LayerMajorLogits {
 public:
  /// `stream` must hold its LM head (LayerStream::hold_lm_head) and outlive this object.
  explicit LayerMajorLogits(const LayerStream& stream);

  /// Runs `inputs` (each [n] token ids, n ≥ 1, all the same length, positions 0 … n−1 with a fresh
  /// FP32 KV cache) through every layer, reading each layer once, and keeps each input's final
  /// hidden rows first_row … n−1 ([n − first_row, dim] FP32). Inputs run in parallel, one per
  /// thread, for dim < 1024 (runs_windows_in_parallel's cut-off), otherwise one at a time with
  /// parallel ops. `on_layer(l + 1, n_layers)` after each layer. Memory: 4 · dim · n per input.
  /// Throws std::out_of_range for a bad token id, std::length_error for n beyond the context,
  /// std::invalid_argument for unequal lengths or first_row outside [0, n), NonFiniteError naming
  /// the layer and input index ("non-finite activation in layer 3 (residual stream) at chunk 2 …",
  /// `where(i)` giving "at chunk 2 (tokens …)") when a hidden state becomes NaN / ±Inf, and what
  /// LayerStream::layer throws.
  void run(const std::vector<std::vector<int32_t>>& inputs, int64_t first_row,
           const std::function<std::string(size_t)>& where, const std::function<void(int, int)>& on_layer = {});

  /// logits [n − first_row, vocab] row-major of input `i` of the last run(): the final norm and the
  /// LM head on its kept rows (Decoder::project). Throws std::out_of_range for i beyond the inputs.
  void logits(size_t i, float* out) const;
  /// Inputs of the last run().
  size_t size() const { return hidden_.size(); }

 private:
  const LayerStream& stream_;
  int64_t rows_ = 0;                       ///< kept rows per input
  std::vector<std::vector<float>> hidden_;  ///< per input: [rows_, dim]
};

}  // namespace sq
