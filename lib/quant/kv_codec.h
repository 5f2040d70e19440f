// Row codecs of the KV cache: how one token's K or V vector of one layer is stored.
//
// A KV cache row is the vector of one token for one layer: width = n_kv_heads · head_dim FP32
// values (keys possibly before RoPE, see runtime/kv_format.h). A codec turns it into a fixed number
// of dense bytes plus, for dense-and-sparse formats (KVQuant §3.4), a short list of sparse FP16
// outliers; decoding reverses it. Rows are independent of each other, so a cache can evict or
// reorder rows without re-encoding anything.
//
// Dense b-bit codes are packed with quant/packed_bits.h (LSB first, ⌈width·b/8⌉ bytes per row);
// nuq codes are nearest-signpost indices (quant/codebook_quantize.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/kv_format.h"

namespace sq {

/// One sparse outlier of a row: the channel and its value as IEEE FP16 bits (4 bytes).
struct KVOutlier {
  uint16_t channel = 0;
  uint16_t value_f16 = 0;
};

/// Offline quantization parameters of one layer for the nuq formats (stored in the .sqm file).
struct NuqLayerParams {
  std::vector<float> key_codebook;    ///< [2^b] sorted signposts in the normalized domain
  std::vector<float> value_codebook;  ///< [2^b] sorted signposts in the normalized domain
  /// Per-channel key scaling [width] (per-channel key axis only): a = (k − offset) / scale maps the
  /// calibrated range [offset − scale, offset + scale] onto [−1, 1]. With outliers enabled, keys
  /// outside that range are the sparse outliers (the range is then the calibrated per-channel
  /// outlier thresholds, §3.4/§3.7).
  std::vector<float> key_offset, key_scale;
};

/// Encodes / decodes the rows of one layer's K or V. Implementations are immutable and safe to
/// use from several threads.
class KVCodec {
 public:
  virtual ~KVCodec() = default;
  /// Dense bytes per row.
  virtual int64_t row_bytes() const = 0;
  /// Encodes x [width] FP32 into dst [row_bytes()] and appends this row's sparse outliers (channel
  /// ascending) to `sparse`. Non-finite inputs are clamped to the representable range.
  virtual void encode(const float* x, uint8_t* dst, std::vector<KVOutlier>& sparse) const = 0;
  /// Decodes src [row_bytes()] into x [width], then writes the `n_sparse` outliers.
  virtual void decode(const uint8_t* src, const KVOutlier* sparse, int64_t n_sparse, float* x) const = 0;
};

/// The codec of `spec` for a row of `width` channels (`head_dim` per head): keys when !is_value.
/// `params` must be given for Nuq (the layer's codebooks and per-channel key scaling) and is
/// ignored otherwise. Throws std::invalid_argument when Nuq parameters are missing or have the
/// wrong sizes (codebook not 2^b sorted finite entries, key scaling not [width] with scale > 0).
std::unique_ptr<KVCodec> make_kv_codec(const KVSpec& spec, int64_t width, int64_t head_dim, bool is_value,
                                       const NuqLayerParams* params);

/// Uniform per-token asymmetric codec (Atom §4.4): the row is split into groups of `group`
/// channels; each group stores b-bit codes q = clamp(round((x − z) / Δ), 0, 2^b − 1) with
/// Δ = (max − min) / (2^b − 1) and zero point z = min, both FP16 (rounded before encoding, so
/// decoding x̂ = z + q·Δ uses exactly the stored values). Row layout: codes (⌈width·b/8⌉ bytes),
/// then per group the FP16 Δ and FP16 z. Throws std::invalid_argument when group does not divide
/// width or bits ∉ [1, 8].
std::unique_ptr<KVCodec> make_kv_uniform_codec(int64_t width, int64_t group, int bits);

/// KVQuant nuqX codec (§3.3–3.5). Per-channel (offline scaling from `params`): a_c = (x_c − o_c)/s_c.
/// Per-token (online): the row's lower/upper thresholds t_lo, t_hi are its min/max, or with
/// `outlier_fraction` p > 0 its p/2 and 1 − p/2 percentiles (kv_percentile); o = (t_hi + t_lo)/2,
/// s = (t_hi − t_lo)/2 stored as FP16 after the codes. Elements with |a| > 1 are sparse FP16
/// outliers when p > 0 (dense code 0 for them) and clamped to ±1 otherwise; the rest get the index
/// of the nearest signpost of `codebook` (2^b entries). Decoding: x̂_c = codebook[q_c]·s + o.
/// Throws std::invalid_argument on inconsistent parameters.
std::unique_ptr<KVCodec> make_kv_nuq_codec(int64_t width, int bits, bool per_channel, double outlier_fraction,
                                           std::vector<float> codebook, std::vector<float> offset,
                                           std::vector<float> scale);

/// The FP16 codec used for attention-sink rows of quantized caches (KVQuant §3.6): 2·width bytes.
std::unique_ptr<KVCodec> make_kv_f16_codec(int64_t width);

/// Online per-token scaling of the nuq formats (KVQuant §3.7): lower/upper thresholds of x [width]
/// (finite values only) are its min/max, or with outlier_fraction p > 0 its p/2 and 1 − p/2
/// percentiles (kv_percentile); offset = (hi + lo)/2 and scale = (hi − lo)/2, both rounded to FP16
/// (what the row stores), so that a = (x − offset)/scale ∈ [−1, 1] for the non-outliers.
void kv_token_scaling(const float* x, int64_t width, double outlier_fraction, float& offset, float& scale);

/// Linearly interpolated percentile q ∈ [0, 1] of v [n] (numpy.percentile's default), n ≥ 1.
/// Reorders v.
float kv_percentile(float* v, int64_t n, double q);

}  // namespace sq
