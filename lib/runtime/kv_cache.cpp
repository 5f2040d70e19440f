#include "runtime/kv_cache.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/error.h"
#include "core/rope_frequencies.h"
#include "ops/ops.h"

namespace sq {

KVCache::KVCache(const ModelConfig& config, int64_t capacity) : spec_(), capacity_(capacity) { init(config, nullptr); }

KVCache::KVCache(const ModelConfig& config, int64_t capacity, const KVSpec& spec, const std::vector<NuqLayerParams>* nuq)
    : spec_(spec), capacity_(capacity) {
  check_kv_spec(spec, config);
  init(config, nuq);
}

void KVCache::init(const ModelConfig& c, const std::vector<NuqLayerParams>* nuq) {
  if (capacity_ < 0) throw std::invalid_argument("KV cache capacity must be non-negative");
  width_ = int64_t(c.n_kv_heads) * c.head_dim;
  n_layers_ = c.n_layers;
  n_kv_heads_ = c.n_kv_heads;
  head_dim_ = c.head_dim;
  layer_inv_freq_.clear();
  for (int l = 0; l < c.n_layers; ++l) layer_inv_freq_.push_back(sq::rope_inv_freq(c, l));
  rope_dim_ = c.spec.position == PositionKind::Rope ? c.rope_dim() : 0;
  uniform_full_rope_ = rope_dim_ == c.head_dim;
  for (const auto& f : layer_inv_freq_) uniform_full_rope_ = uniform_full_rope_ && f == layer_inv_freq_[0];
  rope_layout_ = c.rope_layout;
  pre_rope_ = spec_.keys == KVKeyRope::PreRope;
  sparse_ = spec_.kind == KVKind::Nuq && spec_.outlier_fraction > 0;
  if (spec_.kind == KVKind::Nuq) {
    if (!nuq || static_cast<int>(nuq->size()) != n_layers_)
      throw InputError("KV format " + kv_spec_name(spec_) + " needs per-layer codebooks for all " + std::to_string(n_layers_) +
                       " layers (convert the model with sq-convert --kv " + kv_spec_name(spec_) + ")");
  }
  if (spec_.kind == KVKind::Nuq) nuq_ = *nuq;
  layers_.resize(static_cast<size_t>(n_layers_));
  const size_t cap = static_cast<size_t>(capacity_);
  for (int l = 0; l < n_layers_; ++l) {
    LayerStore& L = layers_[static_cast<size_t>(l)];
    const NuqLayerParams* p = spec_.kind == KVKind::Nuq ? &(*nuq)[static_cast<size_t>(l)] : nullptr;
    try {
      L.kc = make_kv_codec(spec_, width_, head_dim_, false, p);
      L.vc = make_kv_codec(spec_, width_, head_dim_, true, p);
    } catch (const std::invalid_argument& e) {
      throw InputError("KV parameters of layer " + std::to_string(l) + ": " + e.what());
    }
    k_row_bytes_ = L.kc->row_bytes();
    v_row_bytes_ = L.vc->row_bytes();
    // The rows themselves are allocated when the layer is first written (allocate_layer): work
    // that runs one decoder layer at a time (calib/layerwise_runner.h) touches one layer's rows,
    // not n_layers × capacity (0.5 GB for a LLaMA-7B shape at 512 positions).
    if (sparse_) {
      L.sparse_k.resize(cap);
      L.sparse_v.resize(cap);
    }
    if (p) {
      table_bytes_ += 4 * static_cast<int64_t>(p->key_codebook.size() + p->value_codebook.size());
      if (spec_.key_axis == KVKeyAxis::PerChannel) table_bytes_ += 4 * static_cast<int64_t>(p->key_offset.size() + p->key_scale.size());
    }
  }
  sink_codec_ = make_kv_f16_codec(width_);
  slot_.assign(cap, 0);
  rotated_.assign(cap, 0);
  text_pos_.assign(cap, 0);
  qerr_k_.assign(cap, 0.0f);
  qerr_v_.assign(cap, 0.0f);
  clear();
}

void KVCache::clear() {
  rows_dense_ = rows_sink_ = outliers_ = 0;
  if (sparse_)
    for (LayerStore& L : layers_) {
      for (auto& v : L.sparse_k) v.clear();
      for (auto& v : L.sparse_v) v.clear();
    }
  length_ = 0;
  pending_ = 0;
  tokens_seen_ = 0;
  identity_ = true;
  free_.clear();
  for (int64_t s = capacity_ - 1; s >= 0; --s) free_.push_back(static_cast<int32_t>(s));
  free_sink_.clear();
  const int sinks = spec_.quantized() ? spec_.sink_fp16 : 0;
  for (int s = sinks - 1; s >= 0; --s) free_sink_.push_back(s);
}

void KVCache::advance(int64_t n) {
  if (n < 0 || n > pending_) throw std::logic_error("KVCache::advance: " + std::to_string(n) + " rows were not written");
  length_ += n;
  tokens_seen_ += n;
  pending_ -= n;
}

void KVCache::assign_rows(int64_t n) {
  // Rows length_ … length_+n−1 get slots the first time any layer writes them.
  if (length_ + n > capacity_)
    throw std::length_error("KV cache full: " + std::to_string(length_) + " + " + std::to_string(n) +
                            " positions exceed capacity " + std::to_string(capacity_));
  for (int64_t r = length_ + pending_; r < length_ + n; ++r) {
    const int64_t text = tokens_seen_ + (r - length_);
    const size_t i = static_cast<size_t>(r);
    text_pos_[i] = text;
    qerr_k_[i] = qerr_v_[i] = 0.0f;
    rotated_[i] = pre_rope_ ? 0 : static_cast<int32_t>(r);
    if (text < (spec_.quantized() ? spec_.sink_fp16 : 0) && !free_sink_.empty()) {
      slot_[i] = -1 - free_sink_.back();
      free_sink_.pop_back();
      ++rows_sink_;
    } else {
      slot_[i] = free_.back();
      free_.pop_back();
      ++rows_dense_;
    }
    if (slot_[i] != r || rotated_[i] != r) identity_ = false;
  }
  pending_ = n;
}

void KVCache::allocate_layer(LayerStore& L) {
  if (L.allocated) return;
  const size_t cap = static_cast<size_t>(capacity_);
  const size_t sinks = static_cast<size_t>(spec_.quantized() ? spec_.sink_fp16 : 0);
  L.k.assign(cap * static_cast<size_t>(k_row_bytes_), 0);
  L.v.assign(cap * static_cast<size_t>(v_row_bytes_), 0);
  L.sink_k.assign(sinks * static_cast<size_t>(2 * width_), 0);
  L.sink_v.assign(sinks * static_cast<size_t>(2 * width_), 0);
  L.allocated = true;
}

void KVCache::write(int l, const float* k, const float* v, int64_t n) {
  if (l < 0 || l >= n_layers_) throw std::out_of_range("KV cache layer " + std::to_string(l) + " out of range");
  if (n > pending_) assign_rows(n);
  LayerStore& L = layers_[static_cast<size_t>(l)];
  allocate_layer(L);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = slot_[static_cast<size_t>(length_ + i)];
    const float* kr = k + i * width_;
    const float* vr = v + i * width_;
    if (s < 0) {
      const size_t off = static_cast<size_t>(-1 - s) * static_cast<size_t>(2 * width_);
      std::vector<KVOutlier> none;
      sink_codec_->encode(kr, L.sink_k.data() + off, none);
      sink_codec_->encode(vr, L.sink_v.data() + off, none);
      continue;
    }
    const size_t ss = static_cast<size_t>(s);
    if (track_qerr_) {
      thread_local std::vector<KVOutlier> sp;
      thread_local std::vector<uint8_t> enc;
      thread_local std::vector<float> dec;
      dec.resize(static_cast<size_t>(width_));
      auto err = [&](const KVCodec& codec, const float* x) {
        sp.clear();
        enc.resize(static_cast<size_t>(codec.row_bytes()));
        codec.encode(x, enc.data(), sp);
        codec.decode(enc.data(), sp.data(), static_cast<int64_t>(sp.size()), dec.data());
        double e = 0;
        for (int64_t c = 0; c < width_; ++c) e += double(x[c] - dec[size_t(c)]) * double(x[c] - dec[size_t(c)]);
        return static_cast<float>(std::sqrt(e));
      };
      qerr_k_[static_cast<size_t>(length_ + i)] += err(*L.kc, kr);
      qerr_v_[static_cast<size_t>(length_ + i)] += err(*L.vc, vr);
    }
    if (sparse_) {
      outliers_ -= static_cast<int64_t>(L.sparse_k[ss].size() + L.sparse_v[ss].size());
      L.sparse_k[ss].clear();
      L.sparse_v[ss].clear();
      L.kc->encode(kr, L.k.data() + ss * static_cast<size_t>(k_row_bytes_), L.sparse_k[ss]);
      L.vc->encode(vr, L.v.data() + ss * static_cast<size_t>(v_row_bytes_), L.sparse_v[ss]);
      outliers_ += static_cast<int64_t>(L.sparse_k[ss].size() + L.sparse_v[ss].size());
    } else {
      thread_local std::vector<KVOutlier> unused;
      unused.clear();
      L.kc->encode(kr, L.k.data() + ss * static_cast<size_t>(k_row_bytes_), unused);
      L.vc->encode(vr, L.v.data() + ss * static_cast<size_t>(v_row_bytes_), unused);
    }
  }
}

KVCache::View KVCache::read(int l, int64_t rows, std::vector<float>& kbuf, std::vector<float>& vbuf) const {
  if (l < 0 || l >= n_layers_) throw std::out_of_range("KV cache layer " + std::to_string(l) + " out of range");
  if (rows < 0 || rows > length_ + pending_)
    throw std::out_of_range("KV cache read of " + std::to_string(rows) + " rows; " + std::to_string(length_ + pending_) + " written");
  const LayerStore& L = layers_[static_cast<size_t>(l)];
  if (!L.allocated && rows > 0) throw std::logic_error("KV cache read of layer " + std::to_string(l) + ", which was never written");
  if (spec_.kind == KVKind::F32 && identity_)
    return {reinterpret_cast<const float*>(L.k.data()), reinterpret_cast<const float*>(L.v.data())};
  const size_t need = static_cast<size_t>(rows * width_);
  if (kbuf.size() < need) kbuf.resize(need);
  if (vbuf.size() < need) vbuf.resize(need);
  thread_local std::vector<int32_t> delta;
  delta.assign(static_cast<size_t>(rows), 0);
  bool rotate = false;
  for (int64_t r = 0; r < rows; ++r) {
    const size_t ri = static_cast<size_t>(r);
    const int32_t s = slot_[ri];
    float* kd = kbuf.data() + r * width_;
    float* vd = vbuf.data() + r * width_;
    if (s < 0) {
      const size_t off = static_cast<size_t>(-1 - s) * static_cast<size_t>(2 * width_);
      sink_codec_->decode(L.sink_k.data() + off, nullptr, 0, kd);
      sink_codec_->decode(L.sink_v.data() + off, nullptr, 0, vd);
    } else {
      const size_t ss = static_cast<size_t>(s);
      const KVOutlier* sk = sparse_ ? L.sparse_k[ss].data() : nullptr;
      const KVOutlier* sv = sparse_ ? L.sparse_v[ss].data() : nullptr;
      const int64_t nk = sparse_ ? static_cast<int64_t>(L.sparse_k[ss].size()) : 0;
      const int64_t nv = sparse_ ? static_cast<int64_t>(L.sparse_v[ss].size()) : 0;
      L.kc->decode(L.k.data() + ss * static_cast<size_t>(k_row_bytes_), sk, nk, kd);
      L.vc->decode(L.v.data() + ss * static_cast<size_t>(v_row_bytes_), sv, nv, vd);
    }
    delta[ri] = static_cast<int32_t>(r) - rotated_[ri];
    rotate = rotate || delta[ri] != 0;
  }
  // RoPE after dequantization (KVQuant §3.2): R(r) = R(r − stored) · R(stored).
  if (rotate && rope_dim_ > 0)
    ops::rope(kbuf.data(), delta.data(), rows, n_kv_heads_, head_dim_, rope_dim_, layer_inv_freq_[static_cast<size_t>(l)].data(),
              rope_layout_);
  return {kbuf.data(), vbuf.data()};
}

void KVCache::free_row_slot(int64_t r) {
  const int32_t s = slot_[static_cast<size_t>(r)];
  if (s < 0) {
    free_sink_.push_back(-1 - s);
    --rows_sink_;
    return;
  }
  free_.push_back(s);
  --rows_dense_;
  if (sparse_)
    for (LayerStore& L : layers_) {
      outliers_ -= static_cast<int64_t>(L.sparse_k[size_t(s)].size() + L.sparse_v[size_t(s)].size());
      L.sparse_k[size_t(s)].clear();
      L.sparse_v[size_t(s)].clear();
    }
}

void KVCache::keep_rows(const std::vector<int64_t>& rows) {
  if (pending_ != 0) throw std::logic_error("KVCache::keep_rows during a forward pass");
  std::vector<char> kept(static_cast<size_t>(length_), 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= length_ || (i > 0 && rows[i] <= rows[i - 1]))
      throw std::invalid_argument("KVCache::keep_rows: row indices must be ascending and < " + std::to_string(length_));
    kept[static_cast<size_t>(rows[i])] = 1;
  }
  for (int64_t r = 0; r < length_; ++r)
    if (!kept[static_cast<size_t>(r)]) free_row_slot(r);
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t from = static_cast<size_t>(rows[i]);
    slot_[i] = slot_[from];
    rotated_[i] = rotated_[from];
    text_pos_[i] = text_pos_[from];
    qerr_k_[i] = qerr_k_[from];
    qerr_v_[i] = qerr_v_[from];
  }
  length_ = static_cast<int64_t>(rows.size());
  identity_ = true;
  for (int64_t r = 0; r < length_; ++r)
    identity_ = identity_ && slot_[static_cast<size_t>(r)] == r && rotated_[static_cast<size_t>(r)] == r;
}

void KVCache::truncate(int64_t n) {
  if (n < 0 || n > length_)
    throw std::invalid_argument("KVCache::truncate: " + std::to_string(n) + " rows requested, the cache holds " +
                                std::to_string(length_));
  // Rows written since the last advance hold slots too. Freed from the last row down, so the free
  // stacks hand the lowest slot (row n's) out first.
  for (int64_t r = length_ + pending_ - 1; r >= n; --r) free_row_slot(r);
  length_ = n;
  pending_ = 0;
  tokens_seen_ = n == 0 ? 0 : text_pos_[static_cast<size_t>(n - 1)] + 1;
}

KVCache::LayerStorage KVCache::layer_storage(int l) const {
  if (l < 0 || l >= n_layers_) throw std::out_of_range("KV cache layer " + std::to_string(l) + " out of range");
  const LayerStore& L = layers_[static_cast<size_t>(l)];
  return {L.k.data(),      L.v.data(),      k_row_bytes_,
          v_row_bytes_,    L.sink_k.data(), L.sink_v.data(),
          sparse_ ? &L.sparse_k : nullptr, sparse_ ? &L.sparse_v : nullptr};
}

KVCacheBytes KVCache::bytes() const {
  // Counters cover every row that holds a slot (maintained by assign_rows, write, keep_rows, clear).
  KVCacheBytes b;
  b.tables = table_bytes_;
  b.sinks = rows_sink_ * int64_t(n_layers_) * 2 * 2 * width_;
  b.dense = rows_dense_ * int64_t(n_layers_) * (k_row_bytes_ + v_row_bytes_);
  if (sparse_) b.outliers = 4 * outliers_ + rows_dense_ * int64_t(n_layers_) * 2 * 4;  // + CSR row pointers
  return b;
}

}  // namespace sq
