// Recipe step "load": option checks common to every scheme, the calibration file, the calibration
// text and its windows (calib/recipe.h).
#include "calib/recipe.h"

#include "calib/window_sampler.h"
#include "core/error.h"
#include "formats/calibration_h5.h"
#include "formats/fingerprint.h"
#include "formats/token_ids_file.h"
#include "formats/tokenizer.h"

namespace sq {

const std::string& ConvertInputs::calibration_text(const std::string& purpose, const std::string& alternative) {
  if (text.path.empty()) text = resolve_calibration_text(calib.provenance, o.calib_path, o.calib_text, purpose, alternative);
  return text.path;
}

std::vector<std::vector<int32_t>> ConvertInputs::redraw_windows(const std::string& path, int64_t n) const {
  const CalibrationProvenance& pv = calib.provenance;
  if (pv.text_format == kTextFormatTokenIds)
    return sample_token_id_windows(read_token_ids_file(path, config.vocab_size), path, n, pv.seq_len, pv.seed);
  auto tok = load_tokenizer(o.tokenizer_path);
  return sample_calibration_windows(path, *tok, n, pv.seq_len, pv.seed);
}

std::string ConvertInputs::fingerprint() const { return streamed() ? model_fingerprint(config, shapes) : model_fingerprint(base); }

void check_calibration_fingerprint(const ConvertInputs& in) {
  const std::string fp = in.fingerprint();
  if (in.calib.provenance.model_fingerprint != fp)
    throw InputError(in.o.calib_path + " was recorded for another model (fingerprint " + in.calib.provenance.model_fingerprint.substr(0, 12) +
                     "…, this model " + fp.substr(0, 12) + "…)");
}

void load_convert_inputs(ConvertInputs& in) {
  const ConvertOptions& o = in.o;
  const ModelConfig& c = in.config;
  if (o.gptq_hessians != "auto" && o.gptq_hessians != "sequential" && o.gptq_hessians != "file")
    throw UsageError("--gptq-hessians must be auto, sequential or file, got '" + o.gptq_hessians + "'");
  if (!(o.alpha >= 0.0f && o.alpha <= 1.0f)) throw UsageError("--alpha must be in [0, 1] or 'auto', got " + std::to_string(o.alpha));
  if (!o.calib_path.empty()) {
    in.calib = read_calibration_h5(o.calib_path, CalibrationHessians::Defer);  // Hessians: per layer, when used
    // A streamed model's inventory is complete only after its last layer: convert_model checks it then.
    if (!in.streamed()) check_calibration_fingerprint(in);
    if (static_cast<int>(in.calib.layers.size()) != c.n_layers)
      throw InputError(o.calib_path + ": " + std::to_string(in.calib.layers.size()) + " layers, the model has " + std::to_string(c.n_layers));
  }
  // A calibration on token ids (sq-calibrate --token-ids) re-draws its windows from the ids, without a tokenizer.
  in.can_redraw = in.calib.provenance.text_format == kTextFormatTokenIds || !o.tokenizer_path.empty();
  in.hessian_mode = o.gptq_hessians;  // auto: sequential whenever the windows can be re-drawn
  if (in.hessian_mode == "auto") in.hessian_mode = in.can_redraw ? "sequential" : "file";
}

}  // namespace sq
