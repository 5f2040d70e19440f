// A model's decoder layers one at a time, for layer-by-layer work (calibration, GPTQ's sequential
// quantization) on models whose FP32 copy exceeds memory: a LLaMA-7B-shaped BF16 checkpoint is
// 13.5 GB on disk and 27 GB in FP32, one of its layers 0.8 GB.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "formats/hf_checkpoint.h"
#include "model/model_loader.h"

namespace sq {

/// A model opened for layer-by-layer work.
///
/// A Hugging Face checkpoint directory or a GGUF file is streamed: opening reads the config and the
/// global tensors (embedding, final norm, LM head, …; widened or dequantized to FP32), and layer(l)
/// reads layer l's tensors when asked (HfCheckpointReader, formats/hf_checkpoint.h; or
/// load_gguf_checkpoint with a selection, formats/gguf_checkpoint.h) and frees them when the caller
/// lets go. Memory: the globals but the LM head, plus the layers the caller holds (a 7B-shaped
/// model: 0.5 GB + 0.8 GB per layer; Qwen2.5-Coder-1.5B from its GGUF: 0.93 GB + 0.19 GB per
/// layer); the mapped file pages a layer was read from are released (MappedFile::release), so they
/// do not accumulate in the resident set. Not yet for F32 safetensors: their tensors stay zero-copy
/// views of the mapping, whose pages stay resident once read (reclaimable page cache, but counted
/// in RSS). A llama2.c file is loaded whole by load_model and layer(l) hands out its resident
/// layer. Every weight is checked for NaN / ±Inf when it is loaded (globals at open, a streamed
/// layer in layer()), as load_model does.
class LayerStream {
 public:
  /// Opens `path`; `stream` false loads a Hugging Face directory or GGUF file whole too (for work that needs
  /// every layer at once: a backward pass, mixture-of-experts routing). Throws what load_model
  /// (model/model_loader.h) and HfCheckpointReader throw, NonFiniteError for a non-finite global
  /// weight, UsageError for a packed .sqm file (layer streams read original checkpoints).
  explicit LayerStream(const std::string& path, bool stream = true);

  /// The model without its layers: path, format, default tokenizer, and a Decoder for embed() and
  /// forward_layer() (its embedding, final norm and RoPE tables). Streamed:
  /// model().model->layers() are empty placeholders, an untied LM head is not held (its
  /// lm_head() must not be called: layer-by-layer work computes no logits), and
  /// model().checkpoint holds the other global tensors only; run layers from layer(l).
  const LoadedModel& model() const { return loaded_; }
  const ModelConfig& config() const { return loaded_.model->config(); }
  /// True when layers are read from disk one at a time (a Hugging Face directory or a GGUF file).
  bool streamed() const { return static_cast<bool>(read_); }

  /// Layer l's FP32 weights: read and widened now when streamed, the resident layer otherwise
  /// (then a non-owning pointer that must not outlive this stream).
  /// Adds the layer's canonical tensors and their shapes to `*shapes` when given. Throws
  /// std::out_of_range for l outside [0, n_layers), the reader's InputError for a bad tensor,
  /// NonFiniteError for a non-finite weight.
  std::shared_ptr<const DecoderLayer> layer(int l, TensorShapes* shapes = nullptr) const;

  /// Layer l's canonical FP32 tensors (config and source set, the layer's tensors only) and the
  /// DecoderLayer built from them, which shares their storage. Streamed: read and widened now, and
  /// the caller holds the only references (dropping both frees the layer); otherwise views of the
  /// resident checkpoint and a non-owning pointer to the resident layer. Throws as layer().
  struct LayerWeights {
    Checkpoint tensors;
    std::shared_ptr<const DecoderLayer> layer;
  };
  LayerWeights layer_weights(int l, TensorShapes* shapes = nullptr) const;

  /// The untied LM head [vocab, dim] (names::kLmHead): streamed, read and widened now (the global
  /// tensors are read again for it, briefly); otherwise the resident tensor. Throws
  /// std::logic_error for a model with tied embeddings, NonFiniteError for a non-finite weight.
  Tensor lm_head() const;

  /// Makes model().model compute logits (Decoder::project) when streamed with an untied head:
  /// reads the head (lm_head()) and sets it as a DenseLinear without a packed copy. No-op when the
  /// head is tied, already held, or the model is resident. Memory: vocab × dim FP32 (0.5 GB at
  /// LLaMA-7B's shape). Throws as lm_head().
  void hold_lm_head();

  /// Shapes of the global tensors (everything outside the layers, the LM head included).
  TensorShapes global_shapes() const;

 private:
  LoadedModel loaded_;
  /// Streamed: reads the selected tensors (a Hugging Face directory's HfCheckpointReader::load, or
  /// load_gguf_checkpoint on the mapped GGUF file); empty when the model is resident.
  std::function<Checkpoint(const HfTensorSelection&)> read_;
  TensorShapes global_shapes_;  ///< streamed: recorded at open
};

}  // namespace sq
