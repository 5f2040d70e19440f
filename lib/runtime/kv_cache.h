// The key/value cache of a decoder, stored in a KV format (runtime/kv_format.h): FP32, uniform
// intX or KVQuant nuqX, optionally with FP16 attention-sink rows and sparse FP16 outliers.
//
// Rows and positions. The cache holds `length()` rows per layer; row r is at CACHE POSITION r,
// which is the RoPE position attention uses for it (StreamingLLM §3.2: positions are assigned
// within the cache). Without eviction row r is also text token r. Each row remembers the position
// its stored key was rotated at (0 for pre-RoPE keys: RoPE at position 0 is the identity), and
// `read` rotates keys by (cache position − stored rotation), so pre-RoPE keys get their RoPE after
// dequantization (KVQuant §3.2) and post-RoPE keys are only re-rotated if eviction moved them.
//
// Storage. Rows live in slots; row → slot is a table, so evicting rows frees slots without moving
// any data. Per layer and for K and V: dense slot bytes [slots, row_bytes] (the codec's layout,
// quant/kv_codec.h), FP16 rows for the first `sink_fp16` text tokens, and per-slot sparse outlier
// lists. Nothing is kept in FP32 for quantized formats: attention reads the packed rows.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/model_config.h"
#include "quant/kv_codec.h"
#include "runtime/kv_format.h"

namespace sq {

/// Bytes a KV cache holds, split by kind (all layers, K and V).
struct KVCacheBytes {
  int64_t dense = 0;     ///< codes + per-row scales of the non-sink rows
  int64_t sinks = 0;     ///< FP16 attention-sink rows
  int64_t outliers = 0;  ///< sparse outliers: 4 bytes each + a 4-byte row pointer per row (CSR)
  int64_t tables = 0;    ///< per-layer codebooks and per-channel key scaling (FP32)
  int64_t total() const { return dense + sinks + outliers + tables; }
};

class KVCache {
 public:
  /// FP32 cache (keys stored after RoPE) for up to `capacity` rows.
  KVCache(const ModelConfig& config, int64_t capacity);
  /// Cache in format `spec`. `nuq` [n_layers] holds the offline parameters the nuq formats need
  /// (from the .sqm file) and is copied; it is ignored for other formats. Throws UsageError when the
  /// spec does not fit the model (check_kv_spec) and InputError when nuq parameters are missing or
  /// inconsistent (the message names the layer).
  KVCache(const ModelConfig& config, int64_t capacity, const KVSpec& spec,
          const std::vector<NuqLayerParams>* nuq = nullptr);

  int64_t capacity() const { return capacity_; }
  int64_t length() const { return length_; }
  int64_t kv_width() const { return width_; }
  const KVSpec& spec() const { return spec_; }
  /// Whether `write` expects keys before RoPE (otherwise rotated at their cache positions).
  bool keys_pre_rope() const { return pre_rope_; }
  /// Tokens appended since the last clear() (text positions of new rows start here).
  int64_t tokens_seen() const { return tokens_seen_; }

  /// Forget all rows (storage is kept).
  void clear();
  /// Mark the `n` rows written since the last advance as filled (after every layer wrote them).
  void advance(int64_t n);

  /// Stores rows length() … length()+n−1 of layer `l`: k, v [n, kv_width] row-major FP32; keys
  /// before RoPE when keys_pre_rope(), else rotated at positions length()+i. Throws
  /// std::length_error when capacity is exceeded, std::out_of_range for a bad layer.
  void write(int l, const float* k, const float* v, int64_t n);

  /// FP32 views of rows [0, rows) of layer `l` (rows ≤ length() + rows written since advance):
  /// keys [rows, kv_width] rotated at their cache positions 0 … rows−1, values [rows, kv_width].
  /// Decodes into kbuf/vbuf (resized as needed) unless the rows are stored as FP32 at their cache
  /// positions already, in which case the pointers point into the cache. Valid until the next
  /// write/clear/evict or until the buffers change.
  struct View {
    const float* keys;
    const float* values;
  };
  View read(int l, int64_t rows, std::vector<float>& kbuf, std::vector<float>& vbuf) const;

  /// Keeps only the listed rows (ascending row indices < length()), which become rows 0 … k−1;
  /// their slots and stored data are untouched. Throws std::invalid_argument for unsorted or
  /// out-of-range indices.
  void keep_rows(const std::vector<int64_t>& rows);

  /// Drops rows n … length()−1 and any rows written since the last advance (a different
  /// continuation of the same text follows, or a forward pass's rows are discarded): rows 0 … n−1 stay
  /// where they are (slots, rotations, text positions), the dropped rows' slots are freed so that the
  /// next rows reuse them in order (an FP32 cache keeps its zero-copy layout), and the next row's
  /// text position is text_position(n−1) + 1. Scoring several continuations of one prefix
  /// (eval/hellaswag.h) runs the prefix once and truncates back to it after each continuation.
  /// Throws std::invalid_argument unless 0 ≤ n ≤ length().
  void truncate(int64_t n);

  /// Text position (token index since clear()) of row r.
  int64_t text_position(int64_t r) const { return text_pos_[static_cast<size_t>(r)]; }

  /// Q-Hitter (Algorithm 1) needs each token's quantization error: when enabled, `write` also
  /// decodes every row it encodes and adds ‖x − x̂‖₂ of that layer's key (value) row to the row's
  /// key (value) error, summed over layers. Off by default (it doubles the encoding work).
  void set_track_quantization_error(bool on) { track_qerr_ = on; }
  /// Σ over layers of ‖K − Quant(K)‖₂ (resp. V) of row r; 0 unless tracking was on when written.
  float key_quantization_error(int64_t r) const { return qerr_k_[static_cast<size_t>(r)]; }
  float value_quantization_error(int64_t r) const { return qerr_v_[static_cast<size_t>(r)]; }

  /// Bytes held for the current rows (what a packed cache of length() tokens occupies).
  KVCacheBytes bytes() const;

  // --- Raw storage, for kernels that read the packed rows directly (runtime/kv_decode_attention.h).
  // Row r ∈ [0, length() + rows written since advance) of any layer is stored in slot
  // row_slots()[r]: s ≥ 0 is dense slot s (codec layout of quant/kv_codec.h), s < 0 is FP16 sink
  // slot −1−s (2·kv_width() bytes, IEEE half per channel). Its key was rotated at position
  // row_rotations()[r] when stored (0 for pre-RoPE keys), so attention must rotate it by
  // r − row_rotations()[r].

  /// One layer's storage; pointers stay valid until the cache is destroyed. A layer's rows are
  /// allocated by its first write(): before it, the row pointers are null.
  struct LayerStorage {
    const uint8_t* keys;     ///< [capacity, key_row_bytes] dense key rows by slot
    const uint8_t* values;   ///< [capacity, value_row_bytes] dense value rows by slot
    int64_t key_row_bytes, value_row_bytes;
    const uint8_t* sink_keys;    ///< [sink_fp16, 2·kv_width] FP16 sink key rows by sink slot
    const uint8_t* sink_values;  ///< [sink_fp16, 2·kv_width] FP16 sink value rows
    /// Sparse outliers by dense slot ([capacity] lists, channel ascending); null when the format
    /// keeps none (then every dense row has none).
    const std::vector<std::vector<KVOutlier>>* key_outliers;
    const std::vector<std::vector<KVOutlier>>* value_outliers;
  };
  /// Storage of layer `l` (std::out_of_range for a bad layer).
  LayerStorage layer_storage(int l) const;
  /// [capacity] row → slot table (see above).
  const int32_t* row_slots() const { return slot_.data(); }
  /// [capacity] position each row's key was rotated at when stored.
  const int32_t* row_rotations() const { return rotated_.data(); }
  /// Rows written so far: length() plus the rows written since the last advance.
  int64_t rows_written() const { return length_ + pending_; }
  /// The nuq parameters of layer `l` as given to the constructor; null for other formats.
  const NuqLayerParams* nuq_params(int l) const {
    return nuq_.empty() ? nullptr : &nuq_[static_cast<size_t>(l)];
  }
  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }
  /// [rope_dim/2] RoPE inverse frequencies of layer `l` (rope_inv_freq(config, l): θ of the layer
  /// and scaling); keys stored before RoPE (or at another position) are rotated with these when
  /// read. Empty for models without RoPE (ALiBi, learned positions), whose keys are never rotated.
  const std::vector<float>& rope_inv_freq(int l) const { return layer_inv_freq_[static_cast<size_t>(l)]; }
  /// Rotated channels per head (ModelConfig::rope_dim()); 0 without RoPE.
  int rope_dim() const { return rope_dim_; }
  /// True when every layer rotates all head_dim channels with the same frequencies (what the fused
  /// nuq decode kernel of runtime/kv_decode_attention.h assumes).
  bool uniform_full_rope() const { return uniform_full_rope_; }
  RopeLayout rope_layout() const { return rope_layout_; }

 private:
  struct LayerStore {
    std::vector<uint8_t> k, v;                      ///< [capacity, row_bytes]
    std::vector<uint8_t> sink_k, sink_v;            ///< [sink_fp16, 2·width]
    std::vector<std::vector<KVOutlier>> sparse_k, sparse_v;  ///< [capacity] per slot (outlier formats)
    std::unique_ptr<KVCodec> kc, vc;
    bool allocated = false;  ///< k, v, sink_k, sink_v sized (on the layer's first write)
  };
  /// Sizes (zero-filled) a layer's row storage, once.
  void allocate_layer(LayerStore& L);
  void init(const ModelConfig& config, const std::vector<NuqLayerParams>* nuq);
  void assign_rows(int64_t n);
  /// Returns row r's slot to its free stack (dense or sink) and drops its outliers and byte counts.
  void free_row_slot(int64_t r);

  KVSpec spec_;
  int64_t capacity_ = 0, width_ = 0, length_ = 0, pending_ = 0, tokens_seen_ = 0;
  int n_layers_ = 0, n_kv_heads_ = 0, head_dim_ = 0;
  std::vector<std::vector<float>> layer_inv_freq_;  ///< [n_layers][rope_dim/2]
  int rope_dim_ = 0;
  bool uniform_full_rope_ = true;
  RopeLayout rope_layout_ = RopeLayout::Interleaved;
  bool pre_rope_ = false, sparse_ = false;
  int64_t k_row_bytes_ = 0, v_row_bytes_ = 0, table_bytes_ = 0;
  std::unique_ptr<KVCodec> sink_codec_;
  std::vector<LayerStore> layers_;
  std::vector<NuqLayerParams> nuq_;  ///< [n_layers] copy of the nuq parameters (nuq formats)
  std::vector<int32_t> slot_;      ///< [capacity] row → slot (≥ 0 dense slot, < 0: sink slot −1−s)
  std::vector<int32_t> rotated_;   ///< [capacity] position row r's key was rotated at when stored
  std::vector<int64_t> text_pos_;  ///< [capacity]
  std::vector<int32_t> free_;      ///< free dense slots (stack)
  std::vector<int32_t> free_sink_; ///< free sink slots
  std::vector<float> qerr_k_, qerr_v_;  ///< [capacity] per-row quantization errors (tracking on)
  bool track_qerr_ = false;
  int64_t rows_dense_ = 0, rows_sink_ = 0, outliers_ = 0;  ///< counters for bytes() in O(1)
  bool identity_ = true;           ///< slot_[r] == r and rotated_[r] == r for all rows (FP32 fast path)
};

}  // namespace sq
