// Accumulated activation statistics for calibration (SmoothQuant §3, KVQuant §3.7, Atom §4.1).
//
// Statistics are running reductions, so memory does not grow with the number of calibration
// tokens, and accumulation order is fixed (samples in order), so the same inputs give
// bit-identical results.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "calib/kv_fisher_samples.h"

namespace sq {

/// Per-token absmax percentiles recorded for clipping studies, in percent.
/// CalibrationProvenance::text_format of a calibration on token ids (sq-calibrate --token-ids).
inline constexpr const char* kTextFormatTokenIds = "token_ids";

inline constexpr std::array<double, 7> kTokenAbsmaxPercentiles = {50.0, 90.0, 99.0, 99.9, 99.99, 99.999, 100.0};

/// Statistics of one activation tensor x [tokens, channels] accumulated over calibration tokens.
struct ChannelStats {
  int64_t channels = 0;
  int64_t tokens = 0;              ///< rows observed
  std::vector<float> absmax;       ///< [channels] max_t |x[t, c]|
  std::vector<float> min;          ///< [channels] min_t x[t, c]
  std::vector<float> max;          ///< [channels] max_t x[t, c]
  std::vector<double> sum_sq;      ///< [channels] Σ_t x[t, c]²  (double: sums over 10^5..10^7 tokens)
  float tensor_absmax = 0;         ///< max over all elements of |x|
  /// Histogram of per-token absmax values (max_c |x[t, c]|) on log2-spaced bins: bin b covers
  /// [2^(kHistMinExp + b/kHistBinsPerOctave), 2^(kHistMinExp + (b+1)/kHistBinsPerOctave)); values below
  /// the first edge go to bin 0, above the last to the last bin. Used for token_absmax_percentiles().
  std::vector<int64_t> token_absmax_hist;
  static constexpr int kHistMinExp = -24;
  static constexpr int kHistBinsPerOctave = 32;
  static constexpr int kHistBins = 48 * kHistBinsPerOctave;  ///< 2^-24 .. 2^24

  /// Allocates zeroed statistics for `channels` channels (min = +inf, max = -inf).
  explicit ChannelStats(int64_t channels = 0);
  /// Accumulates x [n, channels] row-major.
  void observe(const float* x, int64_t n);
  /// Adds another accumulator of the same width (throws std::invalid_argument otherwise).
  void merge(const ChannelStats& other);
  /// Per-token absmax at each of kTokenAbsmaxPercentiles (upper bin edge; the 100th percentile
  /// is exact, tracked separately as tensor_absmax).
  std::vector<float> token_absmax_percentiles() const;
};

/// Statistics of one decoder layer.
struct LayerStats {
  /// Linear inputs, indexed by ActivationSite (attn_input, attn_output, ffn_input, ffn_hidden).
  std::vector<ChannelStats> inputs;
  /// Per-output-channel absmax of each projection, indexed by Projection (q,k,v,o,gate,up,down).
  std::vector<std::vector<float>> output_absmax;
  ChannelStats keys;    ///< K before RoPE [tokens, n_kv_heads*head_dim] (min/max/absmax used)
  ChannelStats values;  ///< V [tokens, n_kv_heads*head_dim]
  /// GPTQ Hessians H = (2/N)·XᵀX of each linear input, indexed by ActivationSite, each
  /// [width, width] row-major double (calib/hessian.h); empty when not recorded (sq-calibrate
  /// without --hessian).
  std::vector<std::vector<double>> hessians;
  int64_t hessian_tokens = 0;  ///< N, the tokens the Hessians were accumulated over
  /// Sampled K/V activations with their Fisher weights (sq-calibrate --fisher; calib/fisher.h);
  /// empty (tokens == 0) when not recorded.
  KVFisherSamples kv_fisher;
};

/// Where the statistics came from (stored as HDF5 attributes; docs/formats.md).
struct CalibrationProvenance {
  std::string model_fingerprint;  ///< hex SHA-256 of the model config and tensor names/shapes/dtypes
  /// The calibration text: sq-calibrate records its absolute, canonical path; files from before
  /// that may hold a relative path (resolution rule: calib/calibration_text.h).
  std::string text_path;
  std::string text_sha256;        ///< hex SHA-256 of the calibration text file's bytes
  /// What text_path holds: "" = text (plain / JSONL / .zst, tokenized by the model's tokenizer),
  /// kTextFormatTokenIds = token ids (sq-calibrate --token-ids; formats/token_ids_file.h), whose
  /// windows sq-convert re-draws without a tokenizer. Stored as the root attribute `text_format`
  /// only when not "" (docs/formats.md).
  std::string text_format;
  int64_t samples = 0;            ///< N windows
  int64_t seq_len = 0;            ///< L tokens per window
  uint64_t seed = 0;
  std::string sqkit_version;
  std::string created;            ///< ISO-8601 UTC time of the run (not part of the datasets)
};

/// Everything sq-calibrate records for one model.
struct CalibrationData {
  CalibrationProvenance provenance;
  std::vector<LayerStats> layers;
  /// Cap on Fisher tokens per layer the run used (sq-calibrate --fisher-tokens); 0 without Fisher data.
  int64_t fisher_max_tokens = 0;
  /// Mean over the calibration windows of each window's mean next-token NLL (nats), from the
  /// Fisher pass; 0 without Fisher data.
  double fisher_mean_loss = 0.0;
  /// Whether the layers carry Fisher data (all of them or none: formats/calibration_h5.h).
  bool has_fisher() const { return !layers.empty() && layers[0].kv_fisher.tokens > 0; }
};

}  // namespace sq
