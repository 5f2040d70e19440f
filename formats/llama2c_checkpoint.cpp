#include "formats/llama2c_checkpoint.h"

#include <climits>
#include <cstdint>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "formats/mapped_file.h"

namespace sq {

namespace {

constexpr uint32_t kMagicAk42 = 0x616b3432;
constexpr size_t kV0HeaderBytes = 7 * sizeof(int32_t);
constexpr size_t kV1HeaderBytes = 256;

struct Header {
  int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

/// Hands out consecutive float32 tensors from the mapped file, checking bounds.
class TensorCursor {
 public:
  TensorCursor(std::shared_ptr<const MappedFile> file, size_t offset) : file_(std::move(file)), offset_(offset) {}
  Tensor next(std::vector<int64_t> shape, const std::string& what) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    if (offset_ + bytes > file_->size())
      throw InputError(file_->path() + ": truncated llama2.c checkpoint: " + what + " needs bytes [" +
                       std::to_string(offset_) + ", " + std::to_string(offset_ + bytes) + ") but the file has " +
                       std::to_string(file_->size()));
    Tensor t = Tensor::view(std::move(shape), reinterpret_cast<const float*>(file_->data() + offset_), file_);
    offset_ += bytes;
    return t;
  }
  /// Tensor stacked over layers [L, rest...] split into per-layer views.
  std::vector<Tensor> next_per_layer(int n_layers, const std::vector<int64_t>& shape, const std::string& what) {
    std::vector<Tensor> out;
    for (int l = 0; l < n_layers; ++l) out.push_back(next(shape, what + " (layer " + std::to_string(l) + ")"));
    return out;
  }
  void skip_floats(int64_t n) { offset_ += static_cast<size_t>(n) * sizeof(float); }
  size_t offset() const { return offset_; }

 private:
  std::shared_ptr<const MappedFile> file_;
  size_t offset_;
};

ModelConfig config_from_header(const Header& h, const std::string& path) {
  ModelConfig c;
  c.architecture = "llama";
  c.dim = h.dim;
  c.hidden_dim = h.hidden_dim;
  c.n_layers = h.n_layers;
  c.n_heads = h.n_heads;
  c.n_kv_heads = h.n_kv_heads;
  if (h.vocab_size == INT32_MIN)  // its negation (the unshared-classifier convention) is not an int32
    throw InputError(path + ": llama2.c header has an implausible vocab_size " + std::to_string(h.vocab_size));
  c.vocab_size = h.vocab_size < 0 ? -h.vocab_size : h.vocab_size;
  c.max_seq_len = h.seq_len;
  c.norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.rope_layout = RopeLayout::Interleaved;
  c.tied_embeddings = h.vocab_size > 0;
  c.qkv_bias = false;
  if (h.n_heads <= 0 || h.dim <= 0 || h.dim % h.n_heads != 0)
    throw InputError(path + ": llama2.c header has dim " + std::to_string(h.dim) + " not divisible by n_heads " +
                     std::to_string(h.n_heads));
  c.head_dim = h.dim / h.n_heads;
  // Bound sizes before doing any arithmetic with them (hostile headers).
  for (int32_t v : {h.dim, h.hidden_dim, h.n_layers, h.n_heads, h.n_kv_heads, h.seq_len, c.vocab_size})
    if (v <= 0 || v > (1 << 24))
      throw InputError(path + ": llama2.c header has an implausible size " + std::to_string(v) +
                       " (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len must be in 1..16777216)");
  c.validate(path);
  return c;
}

/// Bytes of a checkpoint of config `c`: `header_bytes` + 4 * (weights + `extra_floats`), in 128-bit
/// arithmetic. config_from_header bounds every size by 2^24, so no term (at most L * d * hidden,
/// < 2^72) can wrap around: a hostile header yields a huge size, which check_size rejects against the
/// file size before any tensor is sized from it.
unsigned __int128 implied_bytes(const ModelConfig& c, int64_t extra_floats, size_t header_bytes) {
  using u128 = unsigned __int128;
  const u128 d = u128(c.dim), kv = u128(c.n_kv_heads) * u128(c.head_dim), L = u128(c.n_layers),
             q = u128(c.n_heads) * u128(c.head_dim), h = u128(c.hidden_dim), v = u128(c.vocab_size);
  u128 n = v * d + L * (2 * d + 2 * q * d + 2 * kv * d + 3 * d * h) + d + u128(extra_floats);
  if (!c.tied_embeddings) n += v * d;
  return u128(header_bytes) + n * sizeof(float);
}

void check_size(const MappedFile& f, unsigned __int128 expected) {
  const std::string implied = expected > UINT64_MAX ? std::string("more than 2^64") : std::to_string(uint64_t(expected));
  if (f.size() < expected)
    throw InputError(f.path() + ": truncated llama2.c checkpoint: header implies " + implied +
                     " bytes, file has " + std::to_string(f.size()));
  if (f.size() > expected)
    throw InputError(f.path() + ": llama2.c checkpoint has " + std::to_string(f.size() - uint64_t(expected)) +
                     " unexpected trailing bytes (header implies " + implied + " bytes)");
}

struct LayerTensors {
  std::vector<Tensor> attn_norm, ffn_norm, wq, wk, wv, wo, w1, w2, w3;
};

void add_layers(Checkpoint& ck, const LayerTensors& t) {
  for (int l = 0; l < ck.config.n_layers; ++l) {
    const std::string p = names::layer(l);
    ck.tensors[p + "input_layernorm.weight"] = t.attn_norm[l];
    ck.tensors[p + "self_attn.q_proj.weight"] = t.wq[l];
    ck.tensors[p + "self_attn.k_proj.weight"] = t.wk[l];
    ck.tensors[p + "self_attn.v_proj.weight"] = t.wv[l];
    ck.tensors[p + "self_attn.o_proj.weight"] = t.wo[l];
    ck.tensors[p + "post_attention_layernorm.weight"] = t.ffn_norm[l];
    ck.tensors[p + "mlp.gate_proj.weight"] = t.w1[l];
    ck.tensors[p + "mlp.down_proj.weight"] = t.w2[l];
    ck.tensors[p + "mlp.up_proj.weight"] = t.w3[l];
  }
}

}  // namespace

bool looks_like_llama2c_checkpoint(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  int32_t h[7] = {};
  f.read(reinterpret_cast<char*>(h), sizeof h);
  if (f.gcount() < static_cast<std::streamsize>(sizeof h)) return false;
  if (static_cast<uint32_t>(h[0]) == kMagicAk42) return true;
  // Legacy: seven plausible positive sizes (vocab may be negative).
  for (int i = 0; i < 7; ++i) {
    const int64_t v = i == 5 ? (h[i] < 0 ? -int64_t(h[i]) : h[i]) : h[i];
    if (v <= 0 || v > (1 << 24)) return false;
  }
  return h[0] % h[3] == 0;
}

Checkpoint load_llama2c_checkpoint(const std::string& path) { return load_llama2c_checkpoint(MappedFile::open(path)); }

Checkpoint load_llama2c_checkpoint(std::shared_ptr<const MappedFile> file) {
  const std::string path = file->path();
  if (file->size() < kV0HeaderBytes)
    throw InputError(path + ": too short for a llama2.c checkpoint header (" + std::to_string(file->size()) +
                     " bytes, need at least 28)");
  Checkpoint ck;
  ck.source = path;
  ck.format = "llama2c";
  uint32_t magic = 0;
  std::memcpy(&magic, file->data(), 4);
  Header h{};
  LayerTensors t;
  if (magic == kMagicAk42) {
    if (file->size() < kV1HeaderBytes)
      throw InputError(path + ": truncated llama2.c version-1 header (" + std::to_string(file->size()) + " bytes, need 256)");
    int32_t version = 0;
    std::memcpy(&version, file->data() + 4, 4);
    if (version != 1)
      throw UnsupportedError(path + ": llama2.c checkpoint version " + std::to_string(version) +
                             " is not supported (supported: legacy version 0 and version 1 = float32)");
    std::memcpy(&h, file->data() + 8, sizeof h);
    const uint8_t shared = file->data()[8 + sizeof h];
    if (h.vocab_size < 0) throw InputError(path + ": negative vocab_size in a version-1 header");
    if (!shared) h.vocab_size = -h.vocab_size;  // reuse the legacy sign convention for "unshared"
    ck.config = config_from_header(h, path);
    const ModelConfig& c = ck.config;
    check_size(*file, implied_bytes(c, 0, kV1HeaderBytes));
    const int64_t d = c.dim, kv = int64_t(c.n_kv_heads) * c.head_dim, hid = c.hidden_dim, q = int64_t(c.n_heads) * c.head_dim;
    TensorCursor cur(file, kV1HeaderBytes);
    t.attn_norm = cur.next_per_layer(c.n_layers, {d}, "attention norm");
    t.ffn_norm = cur.next_per_layer(c.n_layers, {d}, "ffn norm");
    ck.tensors[names::kFinalNorm] = cur.next({d}, "final norm");
    ck.tensors[names::kEmbed] = cur.next({c.vocab_size, d}, "token embedding");
    t.wq = cur.next_per_layer(c.n_layers, {q, d}, "wq");
    t.wk = cur.next_per_layer(c.n_layers, {kv, d}, "wk");
    t.wv = cur.next_per_layer(c.n_layers, {kv, d}, "wv");
    t.wo = cur.next_per_layer(c.n_layers, {d, q}, "wo");
    t.w1 = cur.next_per_layer(c.n_layers, {hid, d}, "w1");
    t.w2 = cur.next_per_layer(c.n_layers, {d, hid}, "w2");
    t.w3 = cur.next_per_layer(c.n_layers, {hid, d}, "w3");
    if (!c.tied_embeddings) ck.tensors[names::kLmHead] = cur.next({c.vocab_size, d}, "classifier");
  } else {
    std::memcpy(&h, file->data(), sizeof h);
    ck.config = config_from_header(h, path);
    const ModelConfig& c = ck.config;
    const int64_t freq_floats = 2 * int64_t(c.max_seq_len) * (c.head_dim / 2);
    check_size(*file, implied_bytes(c, freq_floats, kV0HeaderBytes));
    const int64_t d = c.dim, kv = int64_t(c.n_kv_heads) * c.head_dim, hid = c.hidden_dim, q = int64_t(c.n_heads) * c.head_dim;
    TensorCursor cur(file, kV0HeaderBytes);
    ck.tensors[names::kEmbed] = cur.next({c.vocab_size, d}, "token embedding");
    t.attn_norm = cur.next_per_layer(c.n_layers, {d}, "attention norm");
    t.wq = cur.next_per_layer(c.n_layers, {q, d}, "wq");
    t.wk = cur.next_per_layer(c.n_layers, {kv, d}, "wk");
    t.wv = cur.next_per_layer(c.n_layers, {kv, d}, "wv");
    t.wo = cur.next_per_layer(c.n_layers, {d, q}, "wo");
    t.ffn_norm = cur.next_per_layer(c.n_layers, {d}, "ffn norm");
    t.w1 = cur.next_per_layer(c.n_layers, {hid, d}, "w1");
    t.w2 = cur.next_per_layer(c.n_layers, {d, hid}, "w2");
    t.w3 = cur.next_per_layer(c.n_layers, {hid, d}, "w3");
    ck.tensors[names::kFinalNorm] = cur.next({d}, "final norm");
    cur.skip_floats(freq_floats);  // precomputed RoPE tables: recomputed by the runner
    if (!c.tied_embeddings) ck.tensors[names::kLmHead] = cur.next({c.vocab_size, d}, "classifier");
  }
  add_layers(ck, t);
  return ck;
}

}  // namespace sq
