#include "calib/calibration_run.h"

#include <ctime>

#include "calib/calibration_text.h"
#include "calib/fisher.h"
#include "calib/hessian.h"
#include "calib/stats_collector.h"
#include "calib/window_sampler.h"
#include "core/error.h"
#include "formats/fingerprint.h"
#include "formats/token_ids_file.h"
#include "formats/tokenizer.h"

namespace sq {

namespace {
std::string utc_now_iso8601() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}
}  // namespace

CalibrationData run_calibration(const LoadedModel& loaded, const Tokenizer* tok, const CalibrationOptions& o) {
  const ModelConfig& c = loaded.model->config();
  if (o.samples < 1) throw UsageError("--samples must be at least 1, got " + std::to_string(o.samples));
  if (o.seq_len < 2) throw UsageError("--seq-len must be at least 2, got " + std::to_string(o.seq_len));
  if (o.seq_len > c.max_seq_len)
    throw UsageError("--seq-len " + std::to_string(o.seq_len) + " exceeds the model's trained context of " +
                     std::to_string(c.max_seq_len) + " tokens");
  if (loaded.checkpoint.tensors.empty())
    throw UsageError(loaded.path + ": calibrate the original (unquantized) checkpoint, not a " + loaded.format + " file");
  if (o.fisher && o.fisher_tokens < 1)
    throw UsageError("--fisher-tokens must be at least 1, got " + std::to_string(o.fisher_tokens));
  if (!o.token_ids && !tok) throw UsageError("calibration on a text needs a tokenizer");

  CalibrationData data;
  CalibrationProvenance& p = data.provenance;
  p.model_fingerprint = model_fingerprint(loaded.checkpoint);
  p.text_sha256 = sha256_file_hex(o.text_path);       // InputError when the text is missing
  p.text_path = canonical_text_path(o.text_path);  // absolute: sq-convert finds it from any directory
  if (o.token_ids) p.text_format = kTextFormatTokenIds;
  p.samples = o.samples;
  p.seq_len = o.seq_len;
  p.seed = o.seed;
  p.sqkit_version = SQ_VERSION;
  p.created = utc_now_iso8601();

  const auto windows =
      o.token_ids ? sample_token_id_windows(read_token_ids_file(o.text_path, c.vocab_size), o.text_path, o.samples, o.seq_len, o.seed)
                  : sample_calibration_windows(o.text_path, *tok, o.samples, o.seq_len, o.seed, [&](int64_t bytes) {
                      if (o.progress) o.progress("reading", bytes, -1);
                    });
  data.layers = collect_activation_stats(*loaded.model, windows, [&](int64_t done, int64_t total) {
    if (o.progress) o.progress("running", done, total);
  });
  if (o.hessian) {
    const HessianCollector h = collect_hessians(*loaded.model, windows, [&](int64_t done, int64_t total) {
      if (o.progress) o.progress("hessians", done, total);
    });
    for (int l = 0; l < c.n_layers; ++l) {
      LayerStats& ls = data.layers[static_cast<size_t>(l)];
      ls.hessians.resize(kActivationSites);
      for (int s = 0; s < kActivationSites; ++s) ls.hessians[static_cast<size_t>(s)] = h.at(l, static_cast<ActivationSite>(s)).hessian();
      ls.hessian_tokens = h.at(l, ActivationSite::AttnInput).tokens();
    }
  }
  if (o.fisher) {
    KVFisherResult f = collect_kv_fisher(*loaded.model, windows, o.fisher_tokens, o.seed, [&](int64_t done, int64_t total) {
      if (o.progress) o.progress("fisher", done, total);
    });
    for (int l = 0; l < c.n_layers; ++l) data.layers[static_cast<size_t>(l)].kv_fisher = std::move(f.layers[static_cast<size_t>(l)]);
    data.fisher_max_tokens = o.fisher_tokens;
    data.fisher_mean_loss = f.mean_loss;
  }
  return data;
}

}  // namespace sq
