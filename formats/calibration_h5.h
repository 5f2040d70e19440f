// The sq-calibrate output file: activation statistics of every decoder layer in HDF5
// (layout: docs/formats.md, "Calibration file (HDF5)").
//
// Summary of format version 1:
//   /                      attributes format="sqkit-calibration", format_version=1 (int32),
//                          model_fingerprint, text_path, text_sha256, sqkit_version, created;
//                          optional text_format = "token_ids" (sq-calibrate --token-ids)
//                          (UTF-8 strings), samples, seq_len (int64), seed (uint64)
//   /layer_000 … /layer_{n−1}   one group per decoder layer (3 digits, more when n > 1000)
//     attn_input, attn_output, ffn_input, ffn_hidden   one group per linear input site,
//                          attribute linears = "q_proj,k_proj,v_proj" etc., plus the site datasets
//     k_cache, v_cache     keys before RoPE / values, the site datasets
//     outputs              datasets q_proj … down_proj: f32 [out_features] per-output-channel absmax
//   site datasets:  absmax, min, max f32 [C]; sum_sq f64 [C]; token_absmax_hist i64 [kHistBins];
//                   token_absmax_percentiles f32 [7] (attribute percent f64 [7]);
//                   attributes tokens (int64), tensor_absmax (f32)
// Optional (sq-calibrate --hessian): site dataset hessian f64 [C·C] with site
// attribute hessian_tokens. Optional, all layers or none (sq-calibrate --fisher, calib/fisher.h):
//   root attributes fisher_max_tokens (int64), fisher_mean_loss (f64), and in every layer
//     kv_fisher            attribute tokens (int64) T; keys, keys_fisher, values, values_fisher
//                          f32 [T, kvw]; positions, windows i32 [T]
//
// The HDF5 library (serial build) is not thread-safe: call these from one thread at a time. Both
// functions switch off HDF5's automatic error printing (H5Eset_auto2) for the whole process; errors
// are reported through the exceptions instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "calib/activation_stats.h"

namespace sq {

/// Calibration file format written by write_calibration_h5 (the only version read_calibration_h5
/// accepts).
inline constexpr int kCalibrationFormatVersion = 1;

/// Writes `data` to `path` in calibration format version 1. The file is written to a temporary
/// file in the same directory and renamed over `path`, so `path` is never left partial.
/// Deterministic: object timestamps are disabled, so the same `data` (including
/// provenance.created) always gives byte-identical files.
/// Throws std::invalid_argument when `data` is inconsistent (no layers, a layer without 4 input
/// sites or 7 output vectors, a ChannelStats whose vectors disagree with `channels` or with each
/// other, a histogram not of kHistBins bins or not summing to `tokens`, or widths that do not fit
/// one LLaMA model — see read_calibration_h5; Fisher data in some layers but not all, or sized
/// inconsistently with its tokens, the k_cache width or fisher_max_tokens); OutputError naming
/// `path` when writing fails.
void write_calibration_h5(const std::string& path, const CalibrationData& data);

/// write_calibration_h5 for Hessians that arrive one layer at a time (sq-calibrate --hessian on a
/// layer-streamed model: a LLaMA-7B shape has 1.4 GB of Hessians per layer, 44 GB in all, which no
/// 24 GB machine holds at once). The file is the same format; only the order of its objects
/// differs. Use: write_hessians(l, …) for layers as they finish, then finish(data) with the
/// statistics of every layer (the layers written early carry no hessians in `data`). Until
/// finish() succeeds everything goes to a temporary beside `path` (formats/atomic_file.h), which
/// the destructor removes: `path` is never left partial. One thread at a time (HDF5).
class CalibrationH5Writer {
 public:
  /// Creates the temporary beside `path`. Throws OutputError naming `path` when it cannot.
  explicit CalibrationH5Writer(const std::string& path);
  ~CalibrationH5Writer();
  CalibrationH5Writer(const CalibrationH5Writer&) = delete;
  CalibrationH5Writer& operator=(const CalibrationH5Writer&) = delete;

  /// Writes layer `layer`'s Hessians: 4 sites in ActivationSite order, each [C·C] row-major doubles
  /// (C = the site's width), with their token count. Throws std::invalid_argument for a bad count
  /// or size, a layer written twice; OutputError when writing fails.
  void write_hessians(int layer, const std::vector<std::vector<double>>& hessians, int64_t tokens);

  /// Writes the rest (validated as write_calibration_h5 does; std::invalid_argument also when a
  /// layer written early carries Hessians again, or lies beyond data.layers) and renames the file
  /// onto `path`. Throws OutputError when writing fails.
  void finish(const CalibrationData& data);

 private:
  struct Impl;
  std::string path_;
  std::unique_ptr<Impl> impl_;
};

/// Reads a calibration file, validating everything before use: the format attribute, the version
/// (another version → UnsupportedError "PATH: calibration format version 3 is not supported (this
/// sqkit reads version 1)"), every root attribute, layer groups contiguous from layer_000, every
/// group, dataset and attribute present with the right rank, dtype class/size and length:
/// absmax/min/max/sum_sq of a group equally long (C ≥ 1), token_absmax_hist of
/// ChannelStats::kHistBins bins with non-negative counts summing to `tokens`,
/// token_absmax_percentiles of 7 values; and widths consistent with one LLaMA model, the same in
/// every layer: ffn_input C = attn_input C = o_proj = down_proj lengths; q_proj length =
/// attn_output C; k_proj = v_proj lengths = k_cache C = v_cache C; gate_proj = up_proj lengths =
/// ffn_hidden C. Fisher data (CalibrationData::has_fisher()) is read when the root attribute
/// fisher_max_tokens exists, and then every layer must have its kv_fisher group, checked by
/// check_calibration_kv_fisher; a file without it (older files included) reads with
/// has_fisher() false. Objects and attributes not listed in the format are ignored.
/// Throws InputError naming the file and the group/dataset/attribute at fault when the file is
/// missing, not HDF5, corrupt or truncated, or violates the format.
/// Deferred reading of Hessians (the large part: 1.4 GB per layer at a LLaMA-7B shape).
enum class CalibrationHessians {
  Read,   ///< every Hessian is read (and checked) now
  Defer,  ///< only their presence, size and hessian_tokens are checked now: a layer with Hessians
          ///< gets LayerStats::hessians of 4 *empty* vectors; read_calibration_hessians reads them
};
CalibrationData read_calibration_h5(const std::string& path, CalibrationHessians hessians = CalibrationHessians::Read);

/// Reads layer `layer`'s Hessians from a calibration file: 4 sites in ActivationSite order, each
/// [C·C] row-major doubles, C from `stats` (that layer's statistics as read_calibration_h5 returned
/// them). Throws InputError naming the file and dataset when a Hessian is missing, of the wrong
/// size or not finite (and as read_calibration_h5 for an unreadable file).
std::vector<std::vector<double>> read_calibration_hessians(const std::string& path, int layer, const LayerStats& stats);

// ---- validation layer ----------------------------------------------------------------------------
// The checks read_calibration_h5 applies to values once HDF5 has read them, as plain functions so
// that tests and the fuzz target (tests/fuzz/calibration_fuzz.cpp) exercise exactly the reader's
// rules without libhdf5. Each throws InputError "PATH: OBJECT why" (`path` names the file).
// (The HDF5-level checks — object presence, dtype class/size, rank, declared sizes bounded by the
// file size — stay in the reader.)

/// Number of layer groups, from the names of the root group's links: names starting with "layer_"
/// must be "layer_" + a zero-padded index of at least 3 digits (layer_000 ... layer_999,
/// layer_1000 ...), contiguous from 0; other names are ignored. Throws InputError when there is no
/// layer group, a name is malformed or an index is missing.
size_t calibration_layer_count(const std::vector<std::string>& root_links, const std::string& path);

/// Checks the statistics of one site read from `group` (e.g. "/layer_000/attn_input"): absmax
/// non-empty, min / max / sum_sq as long as absmax, channels == absmax length, token_absmax_hist of
/// ChannelStats::kHistBins bins, `percentiles` (the token_absmax_percentiles length) == 7, tokens
/// >= 0, histogram counts non-negative and summing to tokens (overflow-safe).
void check_calibration_channel_stats(const ChannelStats& stats, size_t percentiles, const std::string& group,
                                     const std::string& path);

/// Checks the widths of layer `i` of `layers` (4 input sites and 7 output vectors each): one LLaMA
/// layer's relations (see read_calibration_h5) and, for i > 0, the same widths as layer 0.
void check_calibration_layer(const std::vector<LayerStats>& layers, size_t i, const std::string& path);

/// Checks the Fisher samples of one layer read from `group` (e.g. "/layer_001/kv_fisher"):
/// max_tokens (root attribute fisher_max_tokens) ≥ 1; 1 ≤ tokens ≤ max_tokens; width == kv_width
/// (the layer's k_cache width); keys, keys_fisher, values, values_fisher of tokens × width finite
/// values, the Fisher weights ≥ 0; positions and windows of `tokens` values with positions in
/// 0 … seq_len−2 and windows in 0 … samples−1 (from `provenance`), rows in strictly increasing
/// (window, position) order; and, when `layer0` is given, the same positions and windows as layer 0.
void check_calibration_kv_fisher(const KVFisherSamples& samples, int64_t kv_width, int64_t max_tokens,
                                 const CalibrationProvenance& provenance, const KVFisherSamples* layer0,
                                 const std::string& group, const std::string& path);

}  // namespace sq
