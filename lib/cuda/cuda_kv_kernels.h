// Device kernels of the quantized CUDA KV cache (lib/cuda/cuda_kv_cache.h): row encoding (append),
// dequantization of a layer's rows, and split-K decode attention that reads the packed rows.
//
// Plain C++ (no CUDA headers): CudaKVCache and the benchmark (cuda_kv_bench.h) describe one layer's
// device storage with KVLayerDeviceView and call these functions; cuda_kv_kernels.cu implements
// them, cuda_stub.cpp throws UnsupportedError in builds without CUDA. Every pointer is DEVICE
// memory; the functions enqueue work on `stream` and return (results are ready after a
// synchronization). Shapes are checked on the host (std::invalid_argument).
//
// Row layouts are those of the CPU codecs (quant/kv_codec.h): F32 rows are 4·width bytes of floats;
// Int rows are ⌈width·b/8⌉ bytes of packed codes then, per group, FP16 Δ and FP16 zero point; Nuq
// rows are the packed codebook indices, then (per-token rows only) FP16 scale and FP16 offset.
// F16 rows (2·width bytes of IEEE half) exist only as the FP16 baseline of the benchmark. Sparse
// outliers (nuq with outlier_fraction > 0) are kept per row in a fixed array of `outlier_cap`
// 4-byte entries (channel | FP16 value << 16, channel ascending) plus a count; the first
// `n_sinks` rows are FP16 attention sinks [n_sinks, width] and their dense rows are unused.
#pragma once

#include <cstdint>

#include "core/model_config.h"
#include "cuda/cuda_runtime.h"

namespace sq::cuda {

/// Storage format of the rows of one of K or V.
enum class KVRowFormat : int { F32 = 0, F16 = 1, Int = 2, Nuq = 3 };

/// One layer's K or V rows on the device (see the file comment for the layouts).
struct KVDeviceRows {
  KVRowFormat format = KVRowFormat::F32;
  uint8_t* dense = nullptr;  ///< [capacity, row_bytes] row r at dense + r·row_bytes
  int64_t row_bytes = 0;
  int64_t code_bytes = 0;    ///< Int/Nuq: ⌈width·bits/8⌉
  int bits = 0;              ///< Int/Nuq code bits
  int group = 0;             ///< Int: channels per (Δ, zero) group
  bool per_channel = false;  ///< Nuq: offline per-channel scaling (keys); else per-token FP16 scale/offset
  const float* codebook = nullptr;     ///< Nuq: [2^bits] signposts
  const double* midpoints = nullptr;   ///< Nuq: [2^bits] midpoints of the distinct signposts, +inf padded
  const uint8_t* first_of = nullptr;   ///< Nuq: [2^bits] distinct signpost rank → first codebook index
  const float* channel_scale = nullptr;   ///< Nuq per-channel: [width]
  const float* channel_offset = nullptr;  ///< Nuq per-channel: [width]
  uint32_t* outliers = nullptr;      ///< [capacity, outlier_cap] sparse entries, or null (no outliers)
  int32_t* outlier_count = nullptr;  ///< [capacity]
  int outlier_cap = 0;
  double q_lo = 0, q_hi = 1;  ///< Nuq per-token with outliers: the percentiles p/2 and 1 − p/2
  uint16_t* sinks = nullptr;  ///< [n_sinks, width] FP16 sink rows
};

/// One layer of a KV cache on the device.
struct KVLayerDeviceView {
  KVDeviceRows k, v;
  int n_kv_heads = 0, head_dim = 0;
  int n_sinks = 0;              ///< rows 0 … n_sinks−1 are FP16 sinks (quantized formats)
  bool keys_pre_rope = false;   ///< keys stored before RoPE: row j is rotated by j when read (when rope_dim > 0)
  RopeLayout rope_layout = RopeLayout::Interleaved;
  /// Rotated channels per head (partial rotary: the first rope_dim channels, pairs laid out in that
  /// width, as ops::rope's rot_dim overload); 0 = the layer has no RoPE (ALiBi, learned positions):
  /// keys are never rotated. LLaMA: head_dim.
  int rope_dim = 0;
  /// [rope_dim/2] this layer's rope_inv_freq(config, layer) (θ, the local θ of sliding-window
  /// layers, RoPE scaling), as ops::rope uses them; may be null when rope_dim == 0.
  const float* inv_freq = nullptr;
  int64_t width() const { return int64_t(n_kv_heads) * head_dim; }
};

/// Encodes rows p0 … p0+n−1 of a layer from k, v [n, width] device FP32 (keys already rotated
/// when the layer stores them after RoPE): sink rows to FP16, F32 rows copied, Int/Nuq rows
/// quantized exactly as the CPU codecs (same bytes; per-token percentiles by a shared-memory
/// bitonic sort). A row with more sparse outliers than `outlier_cap` keeps the first cap (channel
/// ascending) and clamps the others into its dense codes, adding their number to *overflow
/// (device int64). Throws std::invalid_argument for negative sizes or F16 storage.
void kv_encode(const KVLayerDeviceView& view, const float* k, const float* v, int64_t n, int64_t p0,
               unsigned long long* overflow, Stream stream = {});

/// Decodes rows 0 … rows−1 of a layer into FP32 keys/values [rows, width]; keys stored before RoPE
/// are rotated at their row (cache position) over the first rope_dim channels of each head (none
/// when rope_dim == 0), as KVCache::read does. Throws std::invalid_argument for a bad view (odd or
/// out-of-range rope_dim, pre-RoPE keys with rope_dim > 0 and no inv_freq) or negative rows.
void kv_dequantize(const KVLayerDeviceView& view, int64_t rows, float* keys, float* values, Stream stream = {});

/// Whether kv_decode_attention supports this layer shape and head count: head_dim/2 a power of two
/// ≤ 32, or 64 or 128 (each lane of a 32-lane key segment owns 1, 2 or 4 channel pairs of the head,
/// kvdev::rope_channel_pair: any rope_dim, partial rotary included), and n_heads a positive
/// multiple of n_kv_heads. Pure shape logic (no device needed).
inline bool kv_decode_supported(const KVLayerDeviceView& view, int n_heads) {
  if (view.n_kv_heads <= 0 || n_heads <= 0 || n_heads % view.n_kv_heads != 0) return false;
  if (view.head_dim <= 0 || view.head_dim % 2 != 0) return false;
  const int half = view.head_dim / 2;
  if (half <= 32) return (half & (half - 1)) == 0;
  return half == 64 || half == 128;
}

/// Floats of device scratch kv_decode_attention needs for `rows` keys.
int64_t kv_decode_scratch_floats(const KVLayerDeviceView& view, int n_heads, int64_t rows);

/// Decode attention of one query q [n_heads·head_dim] (already rotated at its position rows − 1)
/// over rows 0 … rows−1 of the layer → out [n_heads·head_dim]: softmax(q·Kᵀ/√d)·V per head, query
/// head h reading KV head h / (n_heads / n_kv_heads), keys stored before RoPE rotated on the fly at
/// their rows (the first rope_dim channels of each head). Plain attention only: scale 1/√head_dim,
/// no window, no ALiBi (CudaKVCache::attend takes the dequantize + cuda::attention path otherwise). Split-K ("flash-decoding"): blocks over (KV head, ≤ 4 of its query heads, key chunk)
/// each keep an online softmax (Milakov & Gimelshein 2018) over their chunk while reading the
/// packed rows (index + codebook lookup, per-token or per-channel scaling, sparse outliers by
/// binary search, FP16 sinks); a second kernel merges the chunks. `scratch` holds
/// kv_decode_scratch_floats(...) floats. Throws std::invalid_argument unless kv_decode_supported
/// and rows ≥ 1.
void kv_decode_attention(const KVLayerDeviceView& view, const float* q, int n_heads, int64_t rows, float* scratch,
                         float* out, Stream stream = {});

}  // namespace sq::cuda
