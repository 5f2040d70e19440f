// CudaKVCache (cuda/cuda_kv_cache.h): device-neutral C++ over the kernels of cuda/cuda_kv_kernels.h.
#include "cuda/cuda_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/error.h"
#include "core/rope_frequencies.h"
#include "cuda/cuda_ops.h"
#include "quant/codebook_quantize.h"

namespace sq {

namespace {

constexpr int64_t kMaxQuantizedWidth = 8192;  ///< the encoder keeps a row (and its sort buffer) in shared memory

}  // namespace

void nuq_signpost_tables(const std::vector<float>& cb, std::vector<double>& mids, std::vector<uint8_t>& first_of) {
  int bits = 0;
  while ((size_t(1) << bits) < cb.size()) ++bits;
  const CodebookQuantizer quantizer(cb, bits);  // validates 2^bits sorted finite signposts
  mids = quantizer.midpoints();
  first_of = quantizer.first_of();
}

int64_t cuda_kv_outlier_capacity(double outlier_fraction, int64_t width) {
  if (!(outlier_fraction > 0)) return 0;
  return std::min<int64_t>(width, static_cast<int64_t>(std::ceil(2.0 * outlier_fraction * double(width))) + 32);
}

CudaKVCache::CudaKVCache(const ModelConfig& c, int64_t capacity, const KVSpec& spec, const std::vector<NuqLayerParams>* params)
    : spec_(spec),
      n_layers_(c.n_layers),
      n_heads_(c.n_heads),
      n_kv_heads_(c.n_kv_heads),
      head_dim_(c.head_dim),
      rope_dim_(c.spec.position == PositionKind::Rope ? c.rope_dim() : 0),
      rope_layout_(c.rope_layout),
      capacity_(capacity),
      width_(int64_t(c.n_kv_heads) * c.head_dim) {
  if (capacity < 1) throw std::invalid_argument("CudaKVCache: capacity must be >= 1, got " + std::to_string(capacity));
  // The CPU cache's checks and messages (KVCache::KVCache / init), and its codecs' row sizes.
  check_kv_spec(spec_, c);
  const bool nuq = spec_.kind == KVKind::Nuq;
  if (nuq && (!params || static_cast<int>(params->size()) != n_layers_))
    throw InputError("KV format " + kv_spec_name(spec_) + " needs per-layer codebooks for all " + std::to_string(n_layers_) +
                     " layers (convert the model with sq-convert --kv " + kv_spec_name(spec_) + ")");
  for (int l = 0; l < n_layers_; ++l) {
    const NuqLayerParams* p = nuq ? &(*params)[static_cast<size_t>(l)] : nullptr;
    try {
      k_row_bytes_ = make_kv_codec(spec_, width_, head_dim_, false, p)->row_bytes();
      v_row_bytes_ = make_kv_codec(spec_, width_, head_dim_, true, p)->row_bytes();
    } catch (const std::invalid_argument& e) {
      throw InputError("KV parameters of layer " + std::to_string(l) + ": " + e.what());
    }
  }
  if (spec_.quantized() && width_ > kMaxQuantizedWidth)
    throw UnsupportedError("CUDA KV cache: quantized rows of " + std::to_string(width_) + " channels (n_kv_heads x head_dim) exceed the " +
                           std::to_string(kMaxQuantizedWidth) + " the device encoder supports");
  require_cuda("CudaKVCache");

  sinks_ = spec_.quantized() ? static_cast<int>(std::min<int64_t>(spec_.sink_fp16, capacity_)) : 0;
  const bool sparse = nuq && spec_.outlier_fraction > 0;
  outlier_cap_ = sparse ? cuda_kv_outlier_capacity(spec_.outlier_fraction, width_) : 0;
  const bool key_per_channel = nuq && spec_.key_axis == KVKeyAxis::PerChannel;
  const int64_t code_bytes = (width_ * spec_.bits + 7) / 8;

  // Each layer's inverse frequencies (θ, local θ, RoPE scaling), the same floats KVCache and
  // ops::rope use; empty for a model without RoPE.
  for (int l = 0; l < n_layers_; ++l) layer_inv_freq_.push_back(rope_inv_freq(c, l));
  overflow_ = DeviceArray<unsigned long long>(1);
  overflow_.zero();

  const size_t cap = static_cast<size_t>(capacity_);
  layers_.resize(static_cast<size_t>(n_layers_));
  views_.resize(static_cast<size_t>(n_layers_));
  for (int l = 0; l < n_layers_; ++l) {
    LayerData& D = layers_[static_cast<size_t>(l)];
    cuda::KVLayerDeviceView& V = views_[static_cast<size_t>(l)];
    D.k = DeviceArray<uint8_t>(cap * static_cast<size_t>(k_row_bytes_));
    D.v = DeviceArray<uint8_t>(cap * static_cast<size_t>(v_row_bytes_));
    D.k.zero();
    D.v.zero();
    if (sinks_ > 0) {
      D.sink_k = DeviceArray<uint16_t>(static_cast<size_t>(sinks_) * static_cast<size_t>(width_));
      D.sink_v = DeviceArray<uint16_t>(static_cast<size_t>(sinks_) * static_cast<size_t>(width_));
      D.sink_k.zero();
      D.sink_v.zero();
    }
    if (sparse) {
      D.out_k = DeviceArray<uint32_t>(cap * static_cast<size_t>(outlier_cap_));
      D.out_v = DeviceArray<uint32_t>(cap * static_cast<size_t>(outlier_cap_));
      D.count_k = DeviceArray<int32_t>(cap);
      D.count_v = DeviceArray<int32_t>(cap);
      D.count_k.zero();
      D.count_v.zero();
    }
    V.n_kv_heads = n_kv_heads_;
    V.head_dim = head_dim_;
    V.n_sinks = sinks_;
    V.keys_pre_rope = keys_pre_rope();
    V.rope_layout = rope_layout_;
    V.rope_dim = rope_dim_;
    const std::vector<float>& f = layer_inv_freq_[static_cast<size_t>(l)];
    if (rope_dim_ > 0 && static_cast<int>(f.size()) != rope_dim_ / 2)
      throw std::logic_error("CudaKVCache: layer " + std::to_string(l) + " has " + std::to_string(f.size()) +
                             " RoPE frequencies for rope_dim " + std::to_string(rope_dim_));
    if (rope_dim_ > 0) D.inv_freq = DeviceArray<float>(f);
    V.inv_freq = rope_dim_ > 0 ? D.inv_freq.data() : nullptr;
    const cuda::KVRowFormat fmt = spec_.kind == KVKind::F32   ? cuda::KVRowFormat::F32
                                  : spec_.kind == KVKind::Int ? cuda::KVRowFormat::Int
                                                              : cuda::KVRowFormat::Nuq;
    for (cuda::KVDeviceRows* R : {&V.k, &V.v}) {
      const bool value = R == &V.v;
      R->format = fmt;
      R->dense = value ? D.v.data() : D.k.data();
      R->row_bytes = value ? v_row_bytes_ : k_row_bytes_;
      R->code_bytes = spec_.quantized() ? code_bytes : 0;
      R->bits = spec_.quantized() ? spec_.bits : 0;
      R->group = spec_.kind == KVKind::Int ? (spec_.group > 0 ? spec_.group : head_dim_) : 0;
      R->per_channel = !value && key_per_channel;
      R->sinks = sinks_ > 0 ? (value ? D.sink_v.data() : D.sink_k.data()) : nullptr;
      if (sparse) {
        R->outliers = value ? D.out_v.data() : D.out_k.data();
        R->outlier_count = value ? D.count_v.data() : D.count_k.data();
        R->outlier_cap = static_cast<int>(outlier_cap_);
        R->q_lo = spec_.outlier_fraction / 2;        // kv_token_scaling's percentiles
        R->q_hi = 1.0 - spec_.outlier_fraction / 2;
      }
    }
    if (nuq) {
      const NuqLayerParams& p = (*params)[static_cast<size_t>(l)];
      std::vector<double> mids;
      std::vector<uint8_t> first;
      D.cb_k = DeviceArray<float>(p.key_codebook);
      D.cb_v = DeviceArray<float>(p.value_codebook);
      nuq_signpost_tables(p.key_codebook, mids, first);
      D.mid_k = DeviceArray<double>(mids);
      D.first_k = DeviceArray<uint8_t>(first);
      nuq_signpost_tables(p.value_codebook, mids, first);
      D.mid_v = DeviceArray<double>(mids);
      D.first_v = DeviceArray<uint8_t>(first);
      V.k.codebook = D.cb_k.data();
      V.k.midpoints = D.mid_k.data();
      V.k.first_of = D.first_k.data();
      V.v.codebook = D.cb_v.data();
      V.v.midpoints = D.mid_v.data();
      V.v.first_of = D.first_v.data();
      // KVCache::bytes() counts the codebooks and, for per-channel keys, the key scaling (FP32).
      table_bytes_ += 4 * static_cast<int64_t>(p.key_codebook.size() + p.value_codebook.size());
      if (key_per_channel) {
        D.ch_scale = DeviceArray<float>(p.key_scale);
        D.ch_offset = DeviceArray<float>(p.key_offset);
        V.k.channel_scale = D.ch_scale.data();
        V.k.channel_offset = D.ch_offset.data();
        table_bytes_ += 4 * static_cast<int64_t>(p.key_offset.size() + p.key_scale.size());
      }
    }
  }
}

void CudaKVCache::check_rows(const char* op, int layer, int64_t n) const {
  if (layer < 0 || layer >= n_layers_)
    throw std::out_of_range(std::string("CudaKVCache::") + op + ": layer " + std::to_string(layer) + " out of range [0, " +
                            std::to_string(n_layers_) + ")");
  if (n < 0) throw std::invalid_argument(std::string("CudaKVCache::") + op + ": negative row count");
  if (length_ + n > capacity_)
    throw std::length_error("KV cache full: " + std::to_string(length_) + " + " + std::to_string(n) + " positions exceed capacity " +
                            std::to_string(capacity_));
}

void CudaKVCache::append(int layer, float* k, const float* v, int64_t n, const int32_t* positions, Stream stream) {
  check_rows("append", layer, n);
  if (n == 0) return;
  if (!keys_pre_rope() && rope_dim_ > 0)
    cuda::rope(k, positions, n, n_kv_heads_, head_dim_, rope_dim_, layer_inv_freq_[static_cast<size_t>(layer)].data(), rope_layout_,
               stream);
  cuda::kv_encode(views_[static_cast<size_t>(layer)], k, v, n, length_, overflow_.data(), stream);
}

void CudaKVCache::attend(int layer, const float* q, int64_t n, float* out, Stream stream) {
  attend(layer, q, n, out, cuda::AttentionOptions{}, stream);
}

void CudaKVCache::attend(int layer, const float* q, int64_t n, float* out, const cuda::AttentionOptions& opt, Stream stream) {
  check_rows("attend", layer, n);
  if (n == 0) return;
  const cuda::KVLayerDeviceView& V = views_[static_cast<size_t>(layer)];
  const int64_t rows = length_ + n;
  if (n == 1 && opt.plain() && cuda::kv_decode_supported(V, n_heads_)) {
    const int64_t need = cuda::kv_decode_scratch_floats(V, n_heads_, rows);
    if (static_cast<int64_t>(scratch_.size()) < need)
      scratch_ = DeviceArray<float>(static_cast<size_t>(std::max<int64_t>(need, 2 * static_cast<int64_t>(scratch_.size()))));
    cuda::kv_decode_attention(V, q, n_heads_, rows, scratch_.data(), out, stream);
    return;
  }
  if (spec_.kind == KVKind::F32 && !keys_pre_rope()) {  // FP32 rows at their positions already
    cuda::attention(q, reinterpret_cast<const float*>(V.k.dense), reinterpret_cast<const float*>(V.v.dense), n, length_, n_heads_,
                    n_kv_heads_, head_dim_, out, opt, stream);
    return;
  }
  const size_t full = static_cast<size_t>(capacity_ * width_);
  if (kbuf_.size() < full) {
    kbuf_ = DeviceArray<float>(full);
    vbuf_ = DeviceArray<float>(full);
  }
  cuda::kv_dequantize(V, rows, kbuf_.data(), vbuf_.data(), stream);
  cuda::attention(q, kbuf_.data(), vbuf_.data(), n, length_, n_heads_, n_kv_heads_, head_dim_, out, opt, stream);
}

void CudaKVCache::advance(int64_t n) {
  if (n < 0 || length_ + n > capacity_)
    throw std::length_error("CudaKVCache::advance: " + std::to_string(length_) + " + " + std::to_string(n) +
                            " positions exceed capacity " + std::to_string(capacity_));
  length_ += n;
}

KVCacheBytes CudaKVCache::bytes() const {
  KVCacheBytes b;
  b.tables = table_bytes_;
  const int64_t rows_sink = std::min<int64_t>(length_, sinks_), rows_dense = length_ - rows_sink;
  b.sinks = rows_sink * int64_t(n_layers_) * 2 * 2 * width_;
  b.dense = rows_dense * int64_t(n_layers_) * (k_row_bytes_ + v_row_bytes_);
  if (outlier_cap_ > 0) {
    int64_t total = 0;
    std::vector<int32_t> counts(static_cast<size_t>(length_));
    for (const LayerData& D : layers_)
      for (const DeviceArray<int32_t>* a : {&D.count_k, &D.count_v}) {
        a->download(counts.data(), counts.size());
        for (const int32_t c : counts) total += c;
      }
    b.outliers = 4 * total + rows_dense * int64_t(n_layers_) * 2 * 4;  // + CSR row pointers, as KVCache counts
  }
  return b;
}

CudaKVCache::HostRow CudaKVCache::row(int layer, bool value, int64_t r) const {
  if (layer < 0 || layer >= n_layers_ || r < 0 || r >= capacity_)
    throw std::out_of_range("CudaKVCache::row: layer " + std::to_string(layer) + " row " + std::to_string(r) + " out of range");
  const LayerData& D = layers_[static_cast<size_t>(layer)];
  HostRow h;
  if (r < sinks_) {
    h.sink.resize(static_cast<size_t>(width_));
    (value ? D.sink_v : D.sink_k).download(h.sink.data(), h.sink.size(), static_cast<size_t>(r * width_));
    return h;
  }
  const int64_t rb = value ? v_row_bytes_ : k_row_bytes_;
  h.dense.resize(static_cast<size_t>(rb));
  (value ? D.v : D.k).download(h.dense.data(), h.dense.size(), static_cast<size_t>(r * rb));
  if (outlier_cap_ > 0) {
    int32_t count = 0;
    (value ? D.count_v : D.count_k).download(&count, 1, static_cast<size_t>(r));
    std::vector<uint32_t> e(static_cast<size_t>(count));
    (value ? D.out_v : D.out_k).download(e.data(), e.size(), static_cast<size_t>(r * outlier_cap_));
    for (const uint32_t x : e) h.outliers.push_back({static_cast<uint16_t>(x & 0xffffu), static_cast<uint16_t>(x >> 16)});
  }
  return h;
}

int64_t CudaKVCache::clamped_outliers() const {
  unsigned long long n = 0;
  overflow_.download(&n, 1);
  return static_cast<int64_t>(n);
}

}  // namespace sq
