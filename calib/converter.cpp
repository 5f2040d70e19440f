// convert_model: runs sq-convert's recipe steps in order (calib/recipe.h). It decides no scheme
// and lists no projection: the quantizer of the scheme (calib/recipe_schemes.cpp) and the model's
// DecoderSpec (model/decoder_linears.h) do.
#include "calib/converter.h"

#include "calib/recipe.h"
#include "calib/recipe_kv.h"
#include "calib/recipe_rotation.h"
#include "calib/recipe_smoothing.h"
#include "calib/recipe_writer.h"
#include "core/error.h"

namespace sq {

namespace {

/// Both entry points: `stream` is null for a resident model.
ConvertSummary convert(const LoadedModel& src, const LayerStream* stream, const ConvertOptions& o, const std::string& out_path) {
  if (src.checkpoint.tensors.empty()) throw UsageError(src.path + ": convert from the original checkpoint, not a " + src.format + " file");
  const std::unique_ptr<LinearQuantizer> quantizer = make_linear_quantizer(o.scheme);
  ConvertInputs in(src, o);
  in.stream = stream;
  const ModelConfig& c = in.config;
  if (in.streamed()) {
    if (o.awq)
      throw UsageError(src.path + ": --awq runs the whole model over the calibration windows; open it whole (not layer by layer)");
    if (o.alpha_auto)
      throw UsageError(src.path + ": --alpha auto runs the whole model over the calibration windows; open it whole (not layer by layer)");
    if (o.kv.spec.kind == KVKind::Nuq && o.kv.params.empty())
      throw UsageError(src.path + ": --kv " + kv_spec_name(o.kv.spec) + " is fitted on the whole model; open it whole (not layer by layer)");
    in.shapes = stream->global_shapes();
  }

  // load: options, calibration file, calibration text
  if ((o.mixed.bits_per_weight > 0 || o.mixed.max_kld > 0) && !quantizer->mixes_precision())
    throw UsageError(std::string("--bits-per-weight / --max-kld mix 4-bit and INT8 linears: they need --scheme w4a16, not ") +
                     scheme_name(o.scheme));
  quantizer->check(in);
  (void)quantizer->embedding_format(in);  // refuses a bad --token-embedding-type before any work
  load_convert_inputs(in);
  if (!o.calib_text.empty() && o.calib_path.empty()) throw UsageError("--calib-text needs --calib (the calibration file it belongs to)");
  if (!o.calib_text.empty() && !quantizer->rereads_calibration_text(in))
    throw UsageError("--calib-text has no effect here: only --alpha auto, --gptq with sequential Hessians and --clip search re-read the "
                     "calibration text");
  ConvertSummary summary;
  // transforms and the quantizer's calibration data
  quantizer->prepare(in, summary);
  const SmoothingStep smoothing(in, quantizer->smooths());
  const RotationStep rotation(in);

  SqmWriter out(out_path, o.write);
  const ConvertScheme enc = quantizer->float_encoding();
  quantizer->write_embedding(in, out);
  write_embedding_globals(out, in, enc);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWork w;
    w.layer = l;
    w.linears = decoder_layer_linears(c, l);
    if (in.streamed()) {  // read and widened now; freed when w goes
      LayerStream::LayerWeights lw = stream->layer_weights(l, &in.shapes);
      w.tensors = std::move(lw.tensors);
      w.fp32_owner = std::move(lw.layer);
      w.fp32 = w.fp32_owner.get();
    } else {
      w.fp32 = &src.model->layers()[size_t(l)];
      w.tensors = in.base.layer(l);  // this layer's tensors only: transforms clone what they touch
    }
    smoothing.apply(in, w, summary);
    rotation.apply(w);
    write_layer_tensors(out, in, w, enc);
    quantizer->convert_layer(in, w, out, summary);
    if (o.progress) o.progress(l + 1, c.n_layers);
  }
  write_final_norm(out, in, enc);
  if (!c.tied_embeddings) quantizer->write_head(in, out);
  if (in.streamed() && !o.calib_path.empty()) check_calibration_fingerprint(in);  // the inventory is complete now

  nlohmann::json header = converter_header(out, in);
  header["quantization"] = quantizer->describe(in, summary);
  if (!is_float_scheme(o.scheme)) header["quantization"]["token_embedding"] = quantizer->embedding_format(in);
  if (rotation.enabled()) header["quantization"]["rotation"] = rotation.describe();
  // The weight-only schemes' INT8 linears (the head, mixed precision) run with FP32 activations
  // (W8A16, model/w8a16_linear.h).
  if ((in.o.quantize_head || !summary.mixed.is_null()) && quantizer->weight_only_head())
    header["quantization"]["int8_activations"] = "fp32";
  write_kv_quantization(out, o.kv, header);
  out.finish(header);
  summary.file_bytes = out.bytes_written();
  return summary;
}

}  // namespace

ConvertSummary convert_model(const LoadedModel& src, const ConvertOptions& o, const std::string& out_path) {
  return convert(src, nullptr, o, out_path);
}

ConvertSummary convert_model(const LayerStream& src, const ConvertOptions& o, const std::string& out_path) {
  return convert(src.model(), &src, o, out_path);
}

}  // namespace sq
