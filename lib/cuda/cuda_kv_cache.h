// The KV cache of the CUDA runner (CudaDecoder) in every KVSpec format of the CPU KVCache
// (runtime/kv_cache.h) except eviction: FP32 (keys after RoPE, or before when spec.keys says so),
// uniform int8/4/3/2 (per-token groups, FP16 Δ and zero point), KVQuant nuq4/3/2 (Hooper et al.
// 2024: per-channel pre-RoPE keys with offline scaling §3.1–3.2, per-token values §3.7, per-layer
// codebooks §3.3, dense-and-sparse FP16 outliers §3.4, FP16 attention sinks §3.6; Q-Norm §3.5 only
// changes the codebook).
//
// Storage (device): per layer, K and V dense rows [capacity, row_bytes] in exactly the byte layout of
// the CPU codecs (quant/kv_codec.h), so a row encoded here decodes identically with the CPU codec;
// row r is at index r (no slot table: there is no eviction). The first spec.sink_fp16 rows are
// FP16 [sinks, width] instead (their dense rows are unused). Sparse outliers: per row a fixed array
// of outlier_capacity() 4-byte entries {channel, FP16 value} (the KVOutlier image) plus a count.
//
// RoPE follows the CPU KVCache: each layer has its own frequencies rope_inv_freq(config, layer)
// (θ, Gemma 3's local θ on sliding-window layers, RoPE scaling), rotating the first
// config.rope_dim() channels of each head (partial rotary); models without RoPE (ALiBi, learned
// positions) never rotate keys. The frequencies live on the host (append's cuda::rope) and on the
// device, one array per layer (the kernels' on-the-fly rotation of pre-RoPE keys).
//
// Where things run: append encodes on the device (cuda/cuda_kv_kernels.h), including the per-token
// percentile thresholds of nuq outliers (a bitonic sort of the row in shared memory). attend with
// n == 1 and plain attention options reads the packed rows directly (split-K decode kernel; no
// dequantized copy of the cache); otherwise (prefill, or a layer with a softmax scale, sliding
// window or ALiBi) it dequantizes the layer's rows into a scratch FP32 buffer [capacity, width] and
// runs cuda::attention with the options (FP32 post-RoPE caches need no copy). Shapes the decode
// kernel does not support (cuda::kv_decode_supported) take that path for n == 1 too.
#pragma once

#include <cstdint>
#include <vector>

#include "core/model_config.h"
#include "cuda/cuda_kv_kernels.h"
#include "cuda/cuda_ops.h"
#include "cuda/cuda_runtime.h"
#include "quant/kv_codec.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_format.h"

namespace sq {

/// Sparse outlier entries reserved per row for outlier fraction p and KV width w:
/// min(w, ⌈2·p·w⌉ + 32), about twice what a row at the calibrated fraction holds. 0 for p = 0.
int64_t cuda_kv_outlier_capacity(double outlier_fraction, int64_t width);

/// The encoder tables of a nuq codebook [2^b] (sorted): `midpoints` [2^b] of the distinct signposts
/// (+inf padded) and `first_of` [2^b], distinct rank → first codebook index: the tables of
/// CodebookQuantizer (quant/codebook_quantize.h), for kvdev::nearest_signpost. Throws
/// std::invalid_argument unless the codebook has 2^b sorted finite signposts.
void nuq_signpost_tables(const std::vector<float>& codebook, std::vector<double>& midpoints, std::vector<uint8_t>& first_of);

/// A KV cache on CUDA device 0 (see the file comment). Not thread-safe.
class CudaKVCache {
 public:
  /// Allocates (and zeroes) a cache of `capacity` rows per layer in format `spec`. `params`
  /// [n_layers] are the nuq codebooks and per-channel key scaling (uploaded; ignored for other
  /// formats). Throws like KVCache's constructor: UsageError when the spec does not fit the model
  /// (check_kv_spec), InputError when nuq parameters are missing or inconsistent (naming the
  /// layer); also std::invalid_argument for capacity < 1, UnsupportedError for quantized rows wider
  /// than 8192 channels (shared-memory encoder), without CUDA or without a device, CudaError when
  /// the device is out of memory.
  CudaKVCache(const ModelConfig& config, int64_t capacity, const KVSpec& spec = {},
              const std::vector<NuqLayerParams>* params = nullptr);

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  const KVSpec& spec() const { return spec_; }
  int64_t kv_width() const { return width_; }
  /// Whether append stores keys before RoPE (otherwise it rotates them at their positions first).
  bool keys_pre_rope() const { return spec_.keys == KVKeyRope::PreRope; }
  /// Rotated channels per head: config.rope_dim() for RoPE models, 0 for models without RoPE (as
  /// KVCache).
  int rope_dim() const { return rope_dim_; }
  /// Forgets every position (the memory is kept).
  void reset() { length_ = 0; }

  /// Bytes held for rows 0 … length()−1, with the accounting of KVCache::bytes(): dense rows (codes
  /// and per-row scales), FP16 sinks, sparse outliers (4 bytes each + a 4-byte row pointer per dense
  /// row), per-layer tables (codebooks, per-channel key scaling, FP32). Reads the outlier counts
  /// from the device (synchronizes).
  KVCacheBytes bytes() const;

  /// Stores n rows of layer `layer` at positions length() … length()+n−1 (does not advance):
  /// k [n, kv_width] device FP32 keys BEFORE RoPE (for post-RoPE formats rotated here first with
  /// cuda::rope over rope_dim() channels at the layer's frequencies, k overwritten; never rotated
  /// when rope_dim() == 0), v [n, kv_width] device FP32, positions [n] device int32 (the rows' cache
  /// positions, used for that rotation). Throws std::out_of_range for a bad layer,
  /// std::length_error when the rows do not fit.
  void append(int layer, float* k, const float* v, int64_t n, const int32_t* positions, Stream stream = {});

  /// Causal GQA attention of n queries q [n, n_heads·head_dim] (already rotated) at positions
  /// length() … length()+n−1 over cache rows 0 … length()+n−1 (the rows just appended included)
  /// → out [n, n_heads·head_dim] (device). Pre-RoPE keys are rotated on the fly at their cache
  /// positions. Plain softmax(q·kᵀ/√d)·v: attend(..., AttentionOptions{}, stream). Throws
  /// std::out_of_range for a bad layer, std::length_error past the capacity.
  void attend(int layer, const float* q, int64_t n, float* out, Stream stream = {});

  /// attend() with the layer's attention options (softmax scale, sliding window, ALiBi slopes; see
  /// cuda::attention), as Decoder::attention without block eviction. The split-K decode kernel
  /// over the packed rows runs only for n == 1 and opt.plain() (as the CPU uses its fused nuq decode
  /// only for plain layers); every other case dequantizes the rows (FP32 post-RoPE rows are read in
  /// place) and runs cuda::attention(..., opt). Throws as attend() and cuda::attention.
  void attend(int layer, const float* q, int64_t n, float* out, const cuda::AttentionOptions& opt, Stream stream = {});

  /// length() += n, after every layer appended its n rows. Throws std::length_error past capacity.
  void advance(int64_t n);

  // --- Inspection (tests): host copies of stored rows.
  /// Row r (< capacity) of layer `layer`: K when !value. `dense` holds the row_bytes of the dense
  /// row (empty for a sink row), `sink` the FP16 row bits of a sink row, `outliers` the sparse
  /// entries (channel ascending). Synchronizes.
  struct HostRow {
    std::vector<uint8_t> dense;
    std::vector<uint16_t> sink;
    std::vector<KVOutlier> outliers;
  };
  HostRow row(int layer, bool value, int64_t r) const;
  /// Outliers that did not fit outlier_capacity() and were clamped into dense codes (0 unless a
  /// row had more than that many); synchronizes.
  int64_t clamped_outliers() const;
  int64_t outlier_capacity() const { return outlier_cap_; }
  /// The device view of layer `layer` (for kernels and benchmarks).
  const cuda::KVLayerDeviceView& view(int layer) const { return views_.at(static_cast<size_t>(layer)); }

 private:
  struct LayerData {
    DeviceArray<uint8_t> k, v;                ///< dense rows [capacity, row_bytes]
    DeviceArray<uint16_t> sink_k, sink_v;     ///< [sinks, width]
    DeviceArray<uint32_t> out_k, out_v;       ///< [capacity, outlier_cap]
    DeviceArray<int32_t> count_k, count_v;    ///< [capacity]
    DeviceArray<float> cb_k, cb_v, ch_scale, ch_offset;
    DeviceArray<double> mid_k, mid_v;
    DeviceArray<uint8_t> first_k, first_v;
    DeviceArray<float> inv_freq;              ///< [rope_dim/2] the layer's frequencies (empty without RoPE)
  };
  void check_rows(const char* op, int layer, int64_t n) const;

  KVSpec spec_;
  int n_layers_ = 0, n_heads_ = 0, n_kv_heads_ = 0, head_dim_ = 0, sinks_ = 0;
  /// [n_layers][rope_dim/2] host rope_inv_freq(config, layer): θ (local θ on window layers), RoPE scaling
  std::vector<std::vector<float>> layer_inv_freq_;
  int rope_dim_ = 0;  ///< rotated channels per head; 0 = no RoPE
  RopeLayout rope_layout_ = RopeLayout::Interleaved;
  int64_t capacity_ = 0, length_ = 0, width_ = 0, k_row_bytes_ = 0, v_row_bytes_ = 0, outlier_cap_ = 0, table_bytes_ = 0;
  std::vector<LayerData> layers_;
  std::vector<cuda::KVLayerDeviceView> views_;
  DeviceArray<unsigned long long> overflow_;  ///< [1] clamped outliers
  DeviceArray<float> kbuf_, vbuf_, scratch_;  ///< prefill FP32 rows; decode partials (grown on demand)
};

}  // namespace sq
