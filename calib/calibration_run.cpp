#include "calib/calibration_run.h"

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <memory>
#include <optional>

#include "calib/calibration_text.h"
#include "calib/fisher.h"
#include "calib/hessian.h"
#include "calib/layerwise_runner.h"
#include "calib/stats_collector.h"
#include "calib/window_sampler.h"
#include "core/error.h"
#include "formats/fingerprint.h"
#include "formats/token_ids_file.h"
#include "formats/tokenizer.h"
#include "model/nonfinite.h"

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

/// The checks, provenance (all but the fingerprint) and windows shared by both entry points.
std::vector<std::vector<int32_t>> prepare_calibration(const ModelConfig& c, const std::string& format, const std::string& path,
                                                      const Tokenizer* tok, const CalibrationOptions& o, CalibrationData& data,
                                                      int hessian_layers_held) {
  if (o.samples < 1) throw UsageError("--samples must be at least 1, got " + std::to_string(o.samples));
  if (o.seq_len < 2) throw UsageError("--seq-len must be at least 2, got " + std::to_string(o.seq_len));
  if (o.seq_len > c.max_seq_len)
    throw UsageError("--seq-len " + std::to_string(o.seq_len) + " exceeds the model's trained context of " +
                     std::to_string(c.max_seq_len) + " tokens");
  if (format == "sqm") throw UsageError(path + ": calibrate the original (unquantized) checkpoint, not a " + format + " file");
  if (o.fisher && o.fisher_tokens < 1)
    throw UsageError("--fisher-tokens must be at least 1, got " + std::to_string(o.fisher_tokens));
  if (!o.token_ids && !tok) throw UsageError("calibration on a text needs a tokenizer");
  if (o.hessian) {  // the Hessians of `hessian_layers_held` layers are held at once
    const double d = c.dim, q = double(c.n_heads) * c.head_dim, h = c.hidden_dim;
    const double bytes = 8.0 * (2 * d * d + q * q + h * h) * hessian_layers_held;
    const double ram = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGESIZE));
    if (ram > 0 && bytes > 0.8 * ram) {
      char msg[256];
      std::snprintf(msg, sizeof msg, "--hessian would hold %.1f GB of GPTQ Hessians (8·width² bytes per input site, %d layers) "
                    "in memory, more than 80%% of this machine's %.1f GB; ", bytes / 1e9, hessian_layers_held, ram / 1e9);
      throw UsageError(path + ": " + msg + "sq-convert --gptq computes them layer by layer itself (sequential)");
    }
  }

  CalibrationProvenance& p = data.provenance;
  p.text_sha256 = sha256_file_hex(o.text_path);       // InputError when the text is missing
  p.text_path = canonical_text_path(o.text_path);  // absolute: sq-convert finds it from any directory
  if (o.token_ids) p.text_format = kTextFormatTokenIds;
  p.samples = o.samples;
  p.seq_len = o.seq_len;
  p.seed = o.seed;
  p.sqkit_version = SQ_VERSION;
  p.created = utc_now_iso8601();

  return o.token_ids ? sample_token_id_windows(read_token_ids_file(o.text_path, c.vocab_size), o.text_path, o.samples, o.seq_len, o.seed)
                     : sample_calibration_windows(o.text_path, *tok, o.samples, o.seq_len, o.seed, [&](int64_t bytes) {
                         if (o.progress) o.progress("reading", bytes, -1);
                       });
}

/// Moves a layer's GPTQ Hessians into `ls`: at(site) is the accumulator of each input site, left
/// empty (HessianAccumulator::take_hessian: no second copy).
template <typename SiteAccumulator>
void store_hessians(LayerStats& ls, SiteAccumulator at) {
  ls.hessian_tokens = at(ActivationSite::AttnInput).tokens();
  ls.hessians.resize(kActivationSites);
  for (int s = 0; s < kActivationSites; ++s) ls.hessians[static_cast<size_t>(s)] = at(static_cast<ActivationSite>(s)).take_hessian();
}

/// One window's observations of one layer: its statistics and, optionally, its Hessians.
class LayerObservations final : public ActivationObserver {
 public:
  LayerObservations(const ModelConfig& c, int l, bool hessian) : stats(c) {
    if (hessian) hessians.emplace(c, l);
  }
  void on_linear_input(int layer, ActivationSite site, const float* x, int64_t n, int64_t width) override {
    stats.on_linear_input(layer, site, x, n, width);
    if (hessians) hessians->on_linear_input(layer, site, x, n, width);
  }
  void on_linear_output(int layer, Projection p, const float* y, int64_t n, int64_t width) override {
    stats.on_linear_output(layer, p, y, n, width);
  }
  void on_kv(int layer, const float* k, const float* v, int64_t n, int64_t width) override { stats.on_kv(layer, k, v, n, width); }
  void merge(const LayerObservations& o) {
    stats.merge(o.stats);
    if (hessians) hessians->merge(*o.hessians);
  }

  StatsCollector stats;
  std::optional<LayerHessians> hessians;
};

}  // namespace

CalibrationData run_calibration(const LoadedModel& loaded, const Tokenizer* tok, const CalibrationOptions& o) {
  const ModelConfig& c = loaded.model->config();
  CalibrationData data;
  const auto windows = prepare_calibration(c, loaded.format, loaded.path, tok, o, data, c.n_layers);
  data.provenance.model_fingerprint = model_fingerprint(loaded.checkpoint);
  data.layers = collect_activation_stats(*loaded.model, windows, [&](int64_t done, int64_t total) {
    if (o.progress) o.progress("running", done, total);
  });
  if (o.hessian) {
    HessianCollector h = collect_hessians(*loaded.model, windows, [&](int64_t done, int64_t total) {
      if (o.progress) o.progress("hessians", done, total);
    });
    for (int l = 0; l < c.n_layers; ++l)
      store_hessians(data.layers[static_cast<size_t>(l)], [&](ActivationSite s) -> HessianAccumulator& { return h.at(l, s); });
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

CalibrationData run_calibration(const LayerStream& model, const Tokenizer* tok, const CalibrationOptions& o) {
  if (!model.streamed()) return run_calibration(model.model(), tok, o);
  const ModelConfig& c = model.config();
  const std::string& path = model.model().path;
  if (o.fisher)
    throw UsageError(path + ": --fisher runs a backward pass through every layer; open the model whole (not layer by layer)");
  if (o.hessian && c.spec.n_experts > 0)
    throw UsageError(path + ": Hessians of mixture-of-experts layers need the whole model; open it whole (not layer by layer)");
  CalibrationData data;
  const auto windows = prepare_calibration(c, model.model().format, path, tok, o, data, o.on_layer_hessians ? 1 : c.n_layers);
  TensorShapes shapes = model.global_shapes();
  LayerwiseRunner runner(*model.model().model, windows);
  StatsCollector stats(c);
  const int64_t n_windows = static_cast<int64_t>(windows.size());
  for (int l = 0; l < c.n_layers; ++l) {
    std::shared_ptr<const DecoderLayer> L = model.layer(l, &shapes);
    LayerObservations total(c, l, o.hessian);
    runner.collect_and_advance(l, *L, total, [&] { return LayerObservations(c, l, o.hessian); });
    L.reset();  // the layer's weights go before its Hessians are finished
    stats.merge(total.stats);
    if (total.hessians) {
      LayerStats& ls = stats.layers()[static_cast<size_t>(l)];
      store_hessians(ls, [&](ActivationSite s) -> HessianAccumulator& { return total.hessians->at(s); });
      if (o.on_layer_hessians) o.on_layer_hessians(l, ls);
    }
    if (const int64_t w = runner.first_nonfinite_window(); w >= 0)
      throw nonfinite_activation_error("layer " + std::to_string(l) + " (its output, the residual stream)",
                                       "in calibration window " + std::to_string(w) + " of " + std::to_string(n_windows));
    if (o.progress) o.progress("layers", l + 1, c.n_layers);
  }
  data.layers = std::move(stats.layers());
  data.provenance.model_fingerprint = model_fingerprint(c, shapes);
  return data;
}

}  // namespace sq
