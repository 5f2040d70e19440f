#include "model/layer_stream.h"

#include <sys/stat.h>

#include <stdexcept>

#include "core/error.h"
#include "core/finite.h"
#include "formats/gguf_checkpoint.h"
#include "formats/gguf_file.h"
#include "model/decoder_linears.h"

namespace sq {

namespace {
bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
}  // namespace

LayerStream::LayerStream(const std::string& path, bool stream) {
  const bool directory = is_directory(path), gguf = !directory && looks_like_gguf(path);
  if (!stream || (!directory && !gguf)) {
    loaded_ = load_model(path);
    if (loaded_.format == "sqm") throw UsageError(path + " is a packed .sqm model; give the original checkpoint");
    return;
  }
  if (directory) {
    auto reader = std::make_shared<const HfCheckpointReader>(path);
    read_ = [reader](const HfTensorSelection& s) { return reader->load(s); };
    loaded_.default_tokenizer = default_hf_tokenizer(path);
  } else {
    auto file = std::make_shared<const GgufFile>(path);
    read_ = [file](const HfTensorSelection& s) { return load_gguf_checkpoint(*file, s); };
    // The tokenizer lives in the GGUF metadata (load_model does the same).
    if (file->has("tokenizer.ggml.model")) loaded_.default_tokenizer = path;
  }
  Checkpoint globals = read_(HfTensorSelection::only_globals());
  check_checkpoint_finite(globals);
  for (const auto& [name, t] : globals.tensors) global_shapes_[name] = t.shape();
  loaded_.model = std::make_unique<Decoder>(Decoder::from_checkpoint_globals(globals));
  // Layer-by-layer work computes no logits: an untied LM head (vocab × dim, 0.5 GB at LLaMA-7B's
  // shape) is not kept.
  if (!loaded_.model->config().tied_embeddings) {
    loaded_.model->set_lm_head(nullptr);
    globals.tensors.erase(names::kLmHead);
  }
  loaded_.path = path;
  loaded_.format = globals.format;
  loaded_.checkpoint = std::move(globals);
}

std::shared_ptr<const DecoderLayer> LayerStream::layer(int l, TensorShapes* shapes) const { return layer_weights(l, shapes).layer; }

LayerStream::LayerWeights LayerStream::layer_weights(int l, TensorShapes* shapes) const {
  const ModelConfig& c = config();
  if (l < 0 || l >= c.n_layers)
    throw std::out_of_range("layer " + std::to_string(l) + " of a model with " + std::to_string(c.n_layers) + " layers");
  LayerWeights w;
  if (!read_) {
    w.tensors = loaded_.checkpoint.layer(l);  // views of the resident tensors
    // Aliasing pointer: the resident layer lives as long as this stream.
    w.layer = std::shared_ptr<const DecoderLayer>(std::shared_ptr<const DecoderLayer>(), &loaded_.model->layers()[size_t(l)]);
  } else {
    w.tensors = read_(HfTensorSelection::only_layer(l));
    check_checkpoint_finite(w.tensors);
    auto layer = std::make_shared<DecoderLayer>(Decoder::layer_from_checkpoint(w.tensors, l));
    // No packed copies of a streamed layer's weights (model/linear.h): the copy would add the
    // layer's FP32 size to the peak memory that streaming bounds.
    set_layer_prepack(config(), l, *layer, false);
    w.layer = std::move(layer);
  }
  if (shapes)
    for (const auto& [name, t] : w.tensors.tensors) (*shapes)[name] = t.shape();
  return w;
}

Tensor LayerStream::lm_head() const {
  if (config().tied_embeddings) throw std::logic_error(loaded_.path + ": the model ties its LM head to the embedding");
  if (!read_) return loaded_.checkpoint.tensors.at(names::kLmHead);
  Checkpoint globals = read_(HfTensorSelection::only_globals());
  for (auto it = globals.tensors.begin(); it != globals.tensors.end();)  // the other globals are held already
    it = it->first == names::kLmHead ? std::next(it) : globals.tensors.erase(it);
  check_checkpoint_finite(globals);
  return globals.tensors.at(names::kLmHead);
}

void LayerStream::hold_lm_head() {
  if (!read_ || config().tied_embeddings || loaded_.model->has_lm_head()) return;
  auto head = std::make_unique<DenseLinear>(lm_head());
  head->set_prepack(false);
  loaded_.model->set_lm_head(std::move(head));
}

TensorShapes LayerStream::global_shapes() const {
  if (read_) return global_shapes_;
  TensorShapes out;
  for (const auto& [name, t] : loaded_.checkpoint.tensors)
    if (name.compare(0, 13, "model.layers.") != 0) out[name] = t.shape();
  return out;
}

}  // namespace sq
