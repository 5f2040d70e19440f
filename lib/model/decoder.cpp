#include "model/decoder.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>
#include <stdexcept>

#include "core/rope_frequencies.h"
#include "model/decoder_layer_flow.h"
#include "model/decoder_linears.h"
#include "model/hadamard_input_linear.h"
#include "model/w4a16_linear.h"
#include "model/w8a8_linear.h"
#include "ops/hadamard.h"
#include "ops/ops.h"
#include "ops/sgemm.h"
#include "runtime/thread_governor.h"

namespace sq {

namespace {
/// Query rows handled per attention task; bounds the score buffer to kQueryBlock × context floats.
constexpr int64_t kQueryBlock = 64;

void ensure(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

/// Runs linears that read the same input x [n, in] into their outputs. When all of them rotate
/// their input online with the same block (HadamardInputLinear), their inner linears run on x
/// rotated once; when all (inner) linears are W8A8 linears that quantize their input identically,
/// x is quantized once (straight into the INT8 kernel's layout; per-token with a rotation: rotated
/// and quantized row by row, quantize_activations_u8_hadamard) and shared; a decode step (n == 1)
/// of W4A16 linears runs them in one parallel region (W4A16Linear::forward_batch1); otherwise each
/// linear runs on its own.
void run_sharing_input(std::span<const std::pair<const Linear*, float*>> linears, const float* x, int64_t n) {
  std::array<std::pair<const Linear*, float*>, 4> inner;
  const HadamardInputLinear* rotation = nullptr;  // the rotation every linear applies to x, if any
  if (const auto* r0 = dynamic_cast<const HadamardInputLinear*>(linears.front().first); r0 && linears.size() > 1) {
    size_t k = 0;
    for (const auto& [lin, y] : linears) {
      const auto* r = dynamic_cast<const HadamardInputLinear*>(lin);
      if (!r || r->block() != r0->block() || k == inner.size()) break;
      inner[k++] = {&r->inner(), y};
    }
    if (k == linears.size()) {
      linears = std::span(inner.data(), k);
      rotation = r0;
    }
  }
  const W8A8Linear* first = dynamic_cast<const W8A8Linear*>(linears.front().first);
  bool shared = first != nullptr;
  for (const auto& [lin, y] : linears) {
    const auto* q = dynamic_cast<const W8A8Linear*>(lin);
    shared = shared && q && q->shares_input_quantization(*first);
  }
  // Per-token(-group) W8A8 rotates each row as it quantizes it; every other case rotates x once first.
  const int64_t fused_block = rotation && shared && first->quantizes_rows_independently() ? rotation->block() : 0;
  if (rotation && fused_block == 0) x = rotation->rotated_input(x, n);
  if (shared) {
    static thread_local W8A8Linear::QuantizedInput qx;
    first->quantize_input_u8(x, n, qx, fused_block);
    for (const auto& [lin, y] : linears) static_cast<const W8A8Linear*>(lin)->forward_prequantized(qx, y);
    return;
  }
  if (n == 1 && linears.size() <= 4) {
    std::array<std::pair<const W4A16Linear*, float*>, 4> w4;
    size_t k = 0;
    for (const auto& [lin, y] : linears)
      if (const auto* q = dynamic_cast<const W4A16Linear*>(lin)) w4[k++] = {q, y};
    if (k == linears.size()) {
      W4A16Linear::forward_batch1(std::span(w4.data(), k), x);
      return;
    }
  }
  for (const auto& [lin, y] : linears) lin->forward(x, n, y);
}


/// Σ_i a[i]·b[i] over n FP32 values: 16 lanes (one AVX-512 vector; GCC splits it elsewhere), then
/// a tree of halving adds. (`omp simd reduction` spilled the 16 lanes and summed them with a chain of
/// 16 dependent scalar adds: decode attention of SmolLM2 at 128 keys spent most of its 14 µs per
/// layer there.)
float dot(const float* a, const float* b, int64_t n) {
  using V16 = float __attribute__((vector_size(64)));
  using V8 = float __attribute__((vector_size(32)));
  using V4 = float __attribute__((vector_size(16)));
  V16 acc = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    V16 x, y;
    std::memcpy(&x, a + i, sizeof(V16));
    std::memcpy(&y, b + i, sizeof(V16));
    acc += x * y;
  }
  const V8 h8 = __builtin_shufflevector(acc, acc, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(acc, acc, 8, 9, 10, 11, 12, 13, 14, 15);
  const V4 h4 = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) + __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
  float s = (h4[0] + h4[2]) + (h4[1] + h4[3]);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

/// out[d] = Σ_j p[j] · v[j·ld + d] for d < width (rows of v with leading dimension ld). Columns go
/// in slices of 64 held in four 16-lane registers over all rows (accumulating into `out` itself
/// made every row wait for the previous row's store).
void weighted_sum(const float* p, const float* v, int64_t ld, int64_t rows, int64_t width, float* out) {
  using V16 = float __attribute__((vector_size(64)));
  int64_t d0 = 0;
  for (; d0 + 64 <= width; d0 += 64) {
    V16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
    for (int64_t j = 0; j < rows; ++j) {
      const float* vj = v + j * ld + d0;
      V16 x0, x1, x2, x3;
      std::memcpy(&x0, vj, sizeof(V16));
      std::memcpy(&x1, vj + 16, sizeof(V16));
      std::memcpy(&x2, vj + 32, sizeof(V16));
      std::memcpy(&x3, vj + 48, sizeof(V16));
      const float pj = p[j];
      a0 += pj * x0;
      a1 += pj * x1;
      a2 += pj * x2;
      a3 += pj * x3;
    }
    std::memcpy(out + d0, &a0, sizeof(V16));
    std::memcpy(out + d0 + 16, &a1, sizeof(V16));
    std::memcpy(out + d0 + 32, &a2, sizeof(V16));
    std::memcpy(out + d0 + 48, &a3, sizeof(V16));
  }
  if (d0 == width) return;
  std::fill(out + d0, out + width, 0.0f);
  for (int64_t j = 0; j < rows; ++j) {
    const float pj = p[j];
    const float* vj = v + j * ld;
#pragma omp simd
    for (int64_t d = d0; d < width; ++d) out[d] += pj * vj[d];
  }
}

/// ALiBi slopes (Press et al. 2022 §3): for n a power of two, slope_h = 2^(−8(h+1)/n); otherwise
/// the slopes of the closest power of two p below n followed by the odd-indexed slopes of 2p
/// (BLOOM's build_alibi_tensor; MPT's gen_slopes with alibi_bias_max 8 gives the same values).
std::vector<float> make_alibi_slopes(int n_heads) {
  int p = 1;
  while (p * 2 <= n_heads) p *= 2;
  std::vector<float> s;
  const double base = std::pow(2.0, -8.0 / p);
  for (int h = 1; h <= p; ++h) s.push_back(static_cast<float>(std::pow(base, h)));
  const double extra = std::pow(2.0, -4.0 / p);  // 2^(−8/(2p))
  for (int h = 1; static_cast<int>(s.size()) < n_heads; h += 2) s.push_back(static_cast<float>(std::pow(extra, h)));
  return s;
}
}  // namespace

Decoder::Decoder(ModelConfig config, Tensor embed, std::vector<DecoderLayer> layers, Tensor final_norm,
                 std::unique_ptr<Linear> lm_head, DecoderGlobals globals)
    : config_(std::move(config)),
      globals_(std::move(globals)),
      embed_(std::move(embed)),
      layers_(std::move(layers)),
      final_norm_(std::move(final_norm)),
      lm_head_(std::move(lm_head)) {
  for (int l = 0; l < config_.n_layers; ++l) rope_inv_freq_.push_back(rope_inv_freq(config_, l));
  if (config_.spec.position == PositionKind::Alibi) alibi_slopes_ = make_alibi_slopes(config_.n_heads);
}

namespace {
/// A checkpoint's canonical FP32 tensors as a WeightSource: DenseLinear everywhere.
class CheckpointSource final : public WeightSource {
 public:
  explicit CheckpointSource(const Checkpoint& ck) : ck_(ck) {}
  Tensor tensor(const std::string& name, const std::vector<int64_t>& shape) const override { return ck_.get(name, shape); }
  std::unique_ptr<Linear> linear(const LinearSlot& s) const override {
    Tensor b;
    if (s.bias) b = ck_.get(s.name + ".bias", {s.out});
    return std::make_unique<DenseLinear>(ck_.get(s.name + ".weight", {s.out, s.in}), b);
  }

 private:
  const Checkpoint& ck_;
};
}  // namespace

Decoder Decoder::from_checkpoint(const Checkpoint& ck) {
  const CheckpointSource src(ck);
  std::vector<DecoderLayer> layers;
  layers.reserve(static_cast<size_t>(ck.config.n_layers));
  for (int l = 0; l < ck.config.n_layers; ++l) layers.push_back(build_decoder_layer(ck.config, l, src));
  Decoder d = from_checkpoint_globals(ck);
  d.layers_ = std::move(layers);
  return d;
}

Decoder Decoder::from_checkpoint_globals(const Checkpoint& ck) {
  const ModelConfig& c = ck.config;
  const CheckpointSource src(ck);
  DecoderGlobals g = build_decoder_globals(c, src);
  Tensor embed = ck.get(names::kEmbed, {c.vocab_size, c.dim});
  auto head = std::make_unique<DenseLinear>(c.tied_embeddings ? embed : ck.get(names::kLmHead, {c.vocab_size, c.dim}));
  return Decoder(c, embed, std::vector<DecoderLayer>(static_cast<size_t>(c.n_layers)), ck.get(names::kFinalNorm, {c.dim}),
                 std::move(head), std::move(g));
}

DecoderLayer Decoder::layer_from_checkpoint(const Checkpoint& ck, int l) { return build_decoder_layer(ck.config, l, CheckpointSource(ck)); }

void Decoder::set_key_rotation(int64_t block) {
  if (block != 0 && (block < 0 || (block & (block - 1)) != 0 || config_.head_dim % block != 0))
    throw std::invalid_argument("Decoder::set_key_rotation: block " + std::to_string(block) + " is not a power of two dividing head_dim " +
                                std::to_string(config_.head_dim));
  key_rotation_ = block;
}

void Decoder::set_quantized_embedding(ops::Int8Codes q, std::vector<float> scales) {
  embed_q_.set_int8(config_.vocab_size, config_.dim, std::move(q), std::move(scales));
  embed_ = Tensor();
}

void Decoder::set_quantized_embedding(Int4Weights w) {
  embed_q_.set_int4(config_.vocab_size, config_.dim, std::move(w));
  embed_ = Tensor();
}

void Decoder::prepare(Workspace& ws, int64_t n, int64_t p0) const {
  const ModelConfig& c = config_;
  const int64_t d = c.dim, qw = int64_t(c.n_heads) * c.head_dim, kvw = int64_t(c.n_kv_heads) * c.head_dim, hid = c.hidden_dim;
  ensure(ws.x, n * d);
  ensure(ws.xn, n * d);
  ensure(ws.q, n * qw);
  ensure(ws.k, n * kvw);
  ensure(ws.v, n * kvw);
  ensure(ws.att, n * qw);
  ensure(ws.proj, n * d);
  ensure(ws.proj2, n * d);
  ensure(ws.gate, n * hid);
  ensure(ws.up, n * hid);
  ws.positions.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) ws.positions[static_cast<size_t>(t)] = static_cast<int32_t>(p0 + t);
  ws.rope_freq.clear();
}

void Decoder::embed(const int32_t* tokens, int64_t n, float* x, int64_t first_position) const {
  const ModelConfig& c = config_;
  const int64_t d = c.dim;
  for (int64_t t = 0; t < n; ++t) {
    const int32_t tok = tokens[t];
    if (tok < 0 || tok >= c.vocab_size)
      throw std::out_of_range("token id " + std::to_string(tok) + " outside the vocabulary of " + std::to_string(c.vocab_size));
    if (embed_q_.empty())
      std::memcpy(x + t * d, embed_.data() + int64_t(tok) * d, static_cast<size_t>(d) * sizeof(float));
    else
      embed_q_.lookup(tok, x + t * d);
  }
  const DecoderSpec& sp = c.spec;
  if (sp.embed_scale != 1.0f)
    for (int64_t i = 0; i < n * d; ++i) x[i] *= sp.embed_scale;
  if (sp.position == PositionKind::Learned) {
    // Learned absolute positions: row p + offset of the table, p = the cache row the token is written
    // to (forward passes cache.length()): its text position until eviction (docs/protocols.md).
    const int64_t t0 = first_position, rows = globals_.embed_positions.shape()[0];
    for (int64_t t = 0; t < n; ++t) {
      const int64_t r = t0 + t + sp.learned_position_offset;
      if (r >= rows)
        throw std::length_error("position " + std::to_string(t0 + t) + " beyond the " + std::to_string(c.max_seq_len) +
                                " learned positions of the model");
      const float* pe = globals_.embed_positions.data() + r * d;
      for (int64_t j = 0; j < d; ++j) x[t * d + j] += pe[j];
    }
  }
  if (sp.embed_norm)
    ops::norm(sp.norm, x, globals_.embed_norm.data(), globals_.embed_norm_bias.data(), x, n, static_cast<int>(d), c.norm_eps);
}

void Decoder::forward(const int32_t* tokens, int64_t n, KVCache& cache, Workspace& ws, float* logits,
                      LogitsFor which, ActivationObserver* obs) const {
  if (n <= 0) return;
  const int64_t first = which == LogitsFor::AllTokens ? 0 : which == LogitsFor::LastToken ? n - 1 : n;  // n: no logits
  run_and_project(tokens, n, first, cache, ws, logits, obs);
}

void Decoder::forward_tail(const int32_t* tokens, int64_t n, int64_t first_row, KVCache& cache, Workspace& ws, float* logits,
                           ActivationObserver* obs) const {
  if (n <= 0) return;
  if (first_row < 0 || first_row >= n)
    throw std::out_of_range("forward_tail: first logit row " + std::to_string(first_row) + " outside [0, " + std::to_string(n) + ")");
  run_and_project(tokens, n, first_row, cache, ws, logits, obs);
}

void Decoder::run_and_project(const int32_t* tokens, int64_t n, int64_t first, KVCache& cache, Workspace& ws, float* logits,
                              ActivationObserver* obs) const {
  const ModelConfig& c = config_;
  const int64_t d = c.dim;
  const int64_t p0 = cache.length();
  if (p0 + n > cache.capacity())
    throw std::length_error("KV cache full: " + std::to_string(p0) + " + " + std::to_string(n) + " positions exceed capacity " +
                            std::to_string(cache.capacity()));
  if (c.n_layers > 0 && !layers_.front().q_proj)
    throw std::logic_error("Decoder::forward on a model without its layers (a layer-streamed model's globals, model/layer_stream.h: "
                           "run the layers from LayerStream::layer)");
  prepare(ws, n, p0);
  float* x = ws.x.data();  // x[n, dim] = embedding rows of the tokens (× embed_scale)
  embed(tokens, n, x, p0);
  const LayerBlock block{0, n, &cache, p0};
  for (int l = 0; l < c.n_layers; ++l) run_layer(l, layers_[static_cast<size_t>(l)], x, n, &block, 1, ws, obs);
  cache.advance(n);

  const int64_t rows = n - first;  // logits of rows first … n−1
  if (rows <= 0) return;
  project_with(x + first * d, rows, ws.xn.data(), logits);
}

void Decoder::project_with(const float* x, int64_t rows, float* xn, float* logits) const {
  const ModelConfig& c = config_;
  ops::norm(c.spec.norm, x, final_norm_.data(), globals_.final_norm_bias.data(), xn, rows, static_cast<int>(c.dim), c.norm_eps);
  lm_head_->forward(xn, rows, logits);  // logits[rows, vocab]
}

void Decoder::project(const float* x, int64_t rows, float* logits) const {
  if (rows <= 0) return;
  std::vector<float> xn(static_cast<size_t>(rows * config_.dim));
  project_with(x, rows, xn.data(), logits);
}

void Decoder::forward_layer(int l, const DecoderLayer& L, float* x, int64_t n, KVCache& cache, Workspace& ws,
                            ActivationObserver* obs) const {
  if (l < 0 || l >= config_.n_layers) throw std::out_of_range("layer " + std::to_string(l) + " out of range");
  const int64_t p0 = cache.length();
  if (n <= 0) return;
  if (p0 + n > cache.capacity())
    throw std::length_error("KV cache full: " + std::to_string(p0) + " + " + std::to_string(n) + " positions exceed capacity " +
                            std::to_string(cache.capacity()));
  prepare(ws, n, p0);
  const LayerBlock block{0, n, &cache, p0};
  run_layer(l, L, x, n, &block, 1, ws, obs);
}

void Decoder::forward_batch(const std::vector<SequenceBlock>& blocks, BatchRows keep, Workspace& ws, float* logits,
                            LogitsFor which) const {
  const ModelConfig& c = config_;
  const DecoderSpec& sp = c.spec;
  const int64_t d = c.dim;
  if (blocks.empty()) return;
  if (c.n_layers > 0 && !layers_.front().q_proj)
    throw std::logic_error("Decoder::forward_batch on a model without its layers (a layer-streamed model's globals)");
  if (blocks.size() > 1 && (ws.eviction.capacity > 0 || ws.attention_mass))
    throw std::logic_error("Decoder::forward_batch: block streaming and attention-mass tracking run one sequence at a time");
  std::vector<LayerBlock> lb;
  lb.reserve(blocks.size());
  int64_t n = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    const SequenceBlock& s = blocks[b];
    if (s.n <= 0 || !s.cache || !s.tokens) throw std::invalid_argument("Decoder::forward_batch: block " + std::to_string(b) + " is empty");
    if (s.cache->keys_pre_rope() != blocks[0].cache->keys_pre_rope())
      throw std::invalid_argument("Decoder::forward_batch: the blocks' caches store keys differently (pre/post RoPE)");
    const int64_t p0 = s.cache->length();
    if (p0 + s.n > s.cache->capacity())
      throw std::length_error("KV cache full: " + std::to_string(p0) + " + " + std::to_string(s.n) + " positions exceed capacity " +
                              std::to_string(s.cache->capacity()));
    for (size_t e = 0; e < b && keep == BatchRows::Keep; ++e)
      if (blocks[e].cache == s.cache)
        throw std::invalid_argument("Decoder::forward_batch: blocks " + std::to_string(e) + " and " + std::to_string(b) +
                                    " share a cache; only BatchRows::Discard allows that");
    lb.push_back({n, s.n, s.cache, p0});
    n += s.n;
  }
  prepare(ws, n, 0);
  float* x = ws.x.data();  // x[n, dim]: the blocks' rows one after the other
  for (const LayerBlock& b : lb) {
    embed(blocks[static_cast<size_t>(&b - lb.data())].tokens, b.n, x + b.row * d, b.p0);
    for (int64_t t = 0; t < b.n; ++t) ws.positions[static_cast<size_t>(b.row + t)] = static_cast<int32_t>(b.p0 + t);
  }
  for (int l = 0; l < c.n_layers; ++l) run_layer(l, layers_[static_cast<size_t>(l)], x, n, lb.data(), lb.size(), ws, nullptr);
  for (const LayerBlock& b : lb) {
    if (keep == BatchRows::Keep) b.cache->advance(b.n);
    else b.cache->truncate(b.p0);  // drops the rows written since the last advance
  }
  if (which == LogitsFor::None) return;
  float* xn = ws.xn.data();
  if (which == LogitsFor::AllTokens) {
    ops::norm(sp.norm, x, final_norm_.data(), globals_.final_norm_bias.data(), xn, n, static_cast<int>(d), c.norm_eps);
    lm_head_->forward(xn, n, logits);  // logits[n, vocab]
    return;
  }
  const int64_t B = static_cast<int64_t>(lb.size());
  for (int64_t b = 0; b < B; ++b)  // gather each block's last row into ws.proj [B, dim]
    std::memcpy(ws.proj.data() + b * d, x + (lb[size_t(b)].row + lb[size_t(b)].n - 1) * d, static_cast<size_t>(d) * sizeof(float));
  ops::norm(sp.norm, ws.proj.data(), final_norm_.data(), globals_.final_norm_bias.data(), xn, B, static_cast<int>(d), c.norm_eps);
  lm_head_->forward(xn, B, logits);  // logits[B, vocab]
}

/// The CPU backend of run_decoder_layer (model/decoder_layer_flow.h): lib/ops on the Workspace's
/// buffers, linears through run_sharing_input, attention through Decoder::attend_blocks (RoPE, the
/// blocks' KV caches, block streaming, the fused nuq decode kernel), and the ActivationObserver.
struct CpuLayerBackend {
  using Layer = DecoderLayer;
  using Linear = sq::Linear;
  const Decoder& model;
  const ModelConfig& c;
  Workspace& ws;
  ActivationObserver* obs;
  const Decoder::LayerBlock* blocks;
  size_t n_blocks;

  LayerBuffers buffers(int64_t n) {
    if (c.spec.n_experts > 0) {
      ensure(ws.router_logits, n * c.spec.n_experts);
      ensure(ws.moe_x, n * c.dim);
      ensure(ws.moe_out, n * c.dim);
    }
    return {ws.xn.data(),   ws.q.data(),    ws.k.data(),  ws.v.data(),  ws.att.data(),           ws.proj.data(),
            ws.proj2.data(), ws.gate.data(), ws.up.data(), c.spec.n_experts > 0 ? ws.router_logits.data() : nullptr,
            ws.moe_x.data(), ws.moe_out.data()};
  }
  void norm(const float* x, const Tensor& w, const Tensor& b, float* y, int64_t rows, int width) {
    ops::norm(c.spec.norm, x, w.data(), b.data(), y, rows, width, c.norm_eps);
  }
  void rms_norm(float* x, const Tensor& w, int64_t rows, int width) { ops::rms_norm(x, w.data(), x, rows, width, c.norm_eps); }
  void add_norm(float* x, const float* r, const Tensor& w, const Tensor& b, float* y, int64_t rows, int width) {
    ops::add_norm(c.spec.norm, x, r, w.data(), b.data(), y, rows, width, c.norm_eps);
  }
  void linear(const Linear& f, const float* x, int64_t rows, float* y) { f.forward(x, rows, y); }
  void linears(std::initializer_list<std::pair<const Linear*, float*>> fs, const float* x, int64_t rows) {
    run_sharing_input(std::span(fs.begin(), fs.size()), x, rows);
  }
  void attend(int l, int64_t n) { model.attend_blocks(l, n, blocks, n_blocks, ws); }
  void add(float* y, const float* x, int64_t count) { ops::add_inplace(y, x, count); }
  void activation(float* x, int64_t count) { ops::activation(c.spec.activation, x, count); }
  void gated_activation(float* gate, const float* up, int64_t count) { ops::gated_activation(c.spec.activation, gate, up, count); }
  const float* host_rows(const float* x, int64_t) { return x; }
  void zero(float* y, int64_t count) { std::fill(y, y + count, 0.0f); }
  void gather_rows(const float* x, const std::vector<int32_t>& rows, int width, float* out) {
    for (size_t i = 0; i < rows.size(); ++i)
      std::memcpy(out + int64_t(i) * width, x + int64_t(rows[i]) * width, static_cast<size_t>(width) * sizeof(float));
  }
  void scatter_add_rows(float* y, const float* src, const std::vector<int32_t>& rows, const std::vector<float>& w, int width) {
    for (size_t i = 0; i < rows.size(); ++i) {
      float* yt = y + int64_t(rows[i]) * width;
      const float* si = src + int64_t(i) * width;
      for (int j = 0; j < width; ++j) yt[j] += si[j] * w[i];
    }
  }
  bool observing() const { return obs != nullptr; }
  void observe_input(int l, ActivationSite site, const float* x, int64_t n, int64_t width) { obs->on_linear_input(l, site, x, n, width); }
  void observe_output(int l, Projection p, const float* y, int64_t n, int64_t width) { obs->on_linear_output(l, p, y, n, width); }
  void observe_kv(int l, const float* k, const float* v, int64_t n, int64_t width) { obs->on_kv(l, k, v, n, width); }
};

void Decoder::run_layer(int l, const DecoderLayer& L, float* x, int64_t n, const LayerBlock* blocks, size_t n_blocks,
                        Workspace& ws, ActivationObserver* obs) const {
  threads::adapt();  // the team size for this layer's regions (runtime/thread_governor.h)
  CpuLayerBackend be{*this, config_, ws, obs, blocks, n_blocks};
  run_decoder_layer(config_, l, L, be, x, n);
}

void Decoder::attend_blocks(int l, int64_t n, const LayerBlock* blocks, size_t n_blocks, Workspace& ws) const {
  const ModelConfig& c = config_;
  const DecoderSpec& sp = c.spec;
  const int64_t hd = c.head_dim, qw = int64_t(c.n_heads) * hd, kvw = int64_t(c.n_kv_heads) * hd;
  // Block streaming (eviction) runs a single block; p0 is then that block's first cache position.
  const int64_t p0 = blocks[0].p0;
  // Queries (and post-RoPE keys) are rotated at their cache positions p0 … p0+n−1; the cache
  // stores the new rows (quantizing them in its format) and returns every row's key rotated at its
  // cache position, dequantized, with the values (runtime/kv_cache.h).
  const std::vector<float>& inv_freq = rope_inv_freq_[static_cast<size_t>(l)];
  int64_t first_sink_query = n;  // rows first_sink_query … n−1 have a sink query in ws.q_sink
  if (sp.position == PositionKind::Rope) {
    const int rd = c.rope_dim();
    const int64_t cap = ws.eviction.capacity, first_evicting = std::max<int64_t>(0, cap - p0);
    if (cap > 0 && ws.eviction.sinks > 0 && first_evicting < n) {
      first_sink_query = first_evicting;
      // Block streaming (BlockEviction): rows at positions ≥ C score the sinks from position C − 1.
      ensure(ws.q_sink, n * qw);
      const int32_t at = static_cast<int32_t>(cap - 1);
      std::vector<float> cs(static_cast<size_t>(rd / 2)), sn(static_cast<size_t>(rd / 2));
      ops::rope_table(&at, 1, rd / 2, inv_freq.data(), cs.data(), sn.data());
      for (int64_t t = first_evicting; t < n; ++t) {
        float* qs = ws.q_sink.data() + t * qw;
        std::copy(ws.q.data() + t * qw, ws.q.data() + (t + 1) * qw, qs);
        ops::rope_apply(qs, 1, c.n_heads, static_cast<int>(hd), rd, cs.data(), sn.data(), c.rope_layout);
      }
    }
    if (ws.rope_freq != inv_freq) {  // angles of these positions at this layer's frequencies, once
      ensure(ws.rope_cos, n * (rd / 2));
      ensure(ws.rope_sin, n * (rd / 2));
      ops::rope_table(ws.positions.data(), n, rd / 2, inv_freq.data(), ws.rope_cos.data(), ws.rope_sin.data());
      ws.rope_freq = inv_freq;
    }
    ops::rope_apply(ws.q.data(), n, c.n_heads, static_cast<int>(hd), rd, ws.rope_cos.data(), ws.rope_sin.data(), c.rope_layout);
    if (!blocks[0].cache->keys_pre_rope())
      ops::rope_apply(ws.k.data(), n, c.n_kv_heads, static_cast<int>(hd), rd, ws.rope_cos.data(), ws.rope_sin.data(), c.rope_layout);
  }
  // Queries and post-RoPE keys rotated per head (set_key_rotation) where the cache quantizes keys:
  // the scores are unchanged, the cache stores rotated keys. Every block shares the cache's format.
  if (key_rotation_ > 0 && blocks[0].cache->spec().quantized() && !blocks[0].cache->keys_pre_rope()) {
    ops::hadamard_rows(ws.q.data(), n, qw, key_rotation_);
    ops::hadamard_rows(ws.k.data(), n, kvw, key_rotation_);
    if (first_sink_query < n)
      ops::hadamard_rows(ws.q_sink.data() + first_sink_query * qw, n - first_sink_query, qw, key_rotation_);
  }
  // Per block: store its rows in its cache, then attend over the cache. Decode steps over a nuq
  // cache attend over the packed rows directly (runtime/kv_decode_attention.h) when the layer is
  // plain causal attention with 1/√d; every other case dequantizes the rows and runs sgemm attention.
  const int window = c.window(l);
  const bool plain = window == 0 && sp.position == PositionKind::Rope && sp.attn_scale == 0.0f;
  for (size_t b = 0; b < n_blocks; ++b) {
    const LayerBlock& B = blocks[b];
    KVCache& cache = *B.cache;
    const float* q = ws.q.data() + B.row * qw;
    float* att = ws.att.data() + B.row * qw;
    cache.write(l, ws.k.data() + B.row * kvw, ws.v.data() + B.row * kvw, B.n);
    const bool fused = B.n == 1 && plain && ws.fused_decode_attention &&
                       nuq_decode_attention(cache, l, B.p0 + 1, q, c.n_heads, att, ws.kv_decode, ws.attention_mass);
    if (!fused) {
      const KVCache::View kv = cache.read(l, B.p0 + B.n, ws.kbuf, ws.vbuf);
      attention(q, kv.keys, kv.values, B.n, B.p0, att, ws, window);  // att[n_b, n_heads*hd]
    }
  }
}

void Decoder::attention(const float* q, const float* keys, const float* values, int64_t n, int64_t p0, float* out,
                        Workspace& ws, int window) const {
  // Causal grouped-query attention for n new queries at positions p0..p0+n-1 over cache rows
  // 0..p0+n-1. Query head h reads KV head g = h / (n_heads / n_kv_heads).
  //   S[i, j] = s · q_h[i] · k_g[j] − slope_h · (i − j)   (lo(i) ≤ j ≤ i; the ALiBi term only for ALiBi models)
  //   out_h[i] = softmax(S[i]) · V_g
  // with lo(i) = max(0, i − window + 1) on sliding-window layers, 0 otherwise. Under block
  // streaming (ws.eviction, BlockEviction) a row i ≥ C also has lo(i) ≥ i − W + 1 (W = C − S) and
  // sees the sinks j < S with S[i, j] = s · q_sink_h[i] · k_g[j] − slope_h · (C − 1 − j).
  // One task is a KV head g and a block of query rows: the rows of all `group` query heads that
  // read g are stacked (row i·group + hl is query row i of head g·group + hl), so K_g and V_g enter
  // one product of group × rows rows instead of `group` products.
  const ModelConfig& c = config_;
  const int64_t hd = c.head_dim, qw = int64_t(c.n_heads) * hd, kvw = int64_t(c.n_kv_heads) * hd;
  const int group = c.n_heads / c.n_kv_heads;
  const float scale = c.spec.attn_scale > 0.0f ? c.spec.attn_scale : 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t n_blocks = (n + kQueryBlock - 1) / kQueryBlock;
  const int64_t tasks = int64_t(c.n_kv_heads) * n_blocks;
  // Parallel over (KV head, query block) only when there is enough work to pay for waking threads
  // (~2^20 multiply-adds); decode steps of small models run on the calling thread.
  const double work = double(n) * double(p0 + n) * double(hd) * c.n_heads;
  std::vector<double>* mass = ws.attention_mass;
  const int threads = (omp_in_parallel() || work < double(1 << 20) || mass) ? 1 : omp_get_max_threads();
  if (mass && static_cast<int64_t>(mass->size()) < p0 + n) mass->resize(static_cast<size_t>(p0 + n), 0.0);
  if (static_cast<int>(ws.scores.size()) < threads) ws.scores.resize(static_cast<size_t>(threads));
  const float* slopes = alibi_slopes_.empty() ? nullptr : alibi_slopes_.data();
  const int64_t cap = ws.eviction.capacity, n_sinks = cap > 0 ? ws.eviction.sinks : 0, span = cap - n_sinks;
  const float* q_sink = c.spec.position == PositionKind::Rope ? ws.q_sink.data() : q;
  // First key row query position pos sees outside the sinks (nondecreasing in pos).
  auto first_key = [&](int64_t pos) {
    int64_t lo = cap > 0 && pos >= cap ? pos - span + 1 : 0;
    if (window > 0) lo = std::max<int64_t>(lo, pos - window + 1);
    return lo;
  };
  // Sinks a query at position ≥ C sees (from position C − 1): s ∈ [sink_lo, S).
  const int64_t sink_lo = window > 0 ? std::max<int64_t>(0, cap - window) : 0;

#pragma omp parallel for schedule(dynamic) num_threads(threads) if (threads > 1 && tasks > 1)
  for (int64_t task = 0; task < tasks; ++task) {
    // Last query block first: its rows see the most keys, so the threads start on the largest
    // tasks and the small ones fill in at the end (dynamic schedule, less waiting at the barrier).
    const int g = static_cast<int>(task % c.n_kv_heads);
    const int64_t r0 = (n_blocks - 1 - task / c.n_kv_heads) * kQueryBlock;
    const int64_t rows = std::min(kQueryBlock, n - r0);
    const int64_t R = rows * group;           // stacked rows: i·group + hl
    const int64_t n_keys = p0 + r0 + rows;    // keys visible to the last row of this block
    const int64_t klo = first_key(p0 + r0);   // first key any row of this block sees (sinks aside)
    const int64_t cols = n_keys - klo;        // score columns: keys klo … n_keys−1
    // Rows i ≥ i_sink of the block score the sinks separately (block streaming past C).
    const int64_t i_sink = n_sinks > 0 ? std::clamp<int64_t>(cap - (p0 + r0), 0, rows) : rows;
    std::vector<float>& S = ws.scores[static_cast<size_t>(omp_get_thread_num())];
    // [R, cols] scores, [R, n_sinks] sink scores, [R, hd] stacked queries, [R, hd] outputs, and
    // [R] 1 / Σ_j e^(S[r, j] − max_j S[r, j]) per stacked row
    ensure(S, R * cols + R * n_sinks + 2 * R * hd + R);
    float* SS = S.data() + R * cols;
    float* Qs = SS + R * n_sinks;
    float* Os = Qs + R * hd;
    float* inv = Os + R * hd;
    const float* Kg = keys + g * hd;
    const float* Vg = values + g * hd;
    // The block's query rows of heads g·group … g·group + group − 1 are one contiguous span of each
    // query row: stacked, row i·group + hl at Qs + (i·group + hl)·hd.
    for (int64_t i = 0; i < rows; ++i)
      std::copy(q + (r0 + i) * qw + int64_t(g) * group * hd, q + (r0 + i) * qw + int64_t(g + 1) * group * hd, Qs + i * group * hd);
    // S[R, cols] = scale · Q_s[R, hd] · K_g[klo … n_keys−1, hd]ᵀ. A decode step's product below 2^16
    // multiply-adds as plain dot products: a small sgemm spends most of its time packing its operands
    // (decode attention, one thread: SmolLM2, 3 × 64 per KV head, 128 keys 7.0 µs with dots vs 10.0
    // with sgemm, 512 keys 29 vs 22 µs; Gemma 3, 4 × 256, 128 keys 10.6 vs 8.1 µs).
    if (rows == 1 && (R == 1 || R * cols * hd < (int64_t(1) << 16)))
      for (int64_t r = 0; r < R; ++r)
        for (int64_t j = 0; j < cols; ++j) S[static_cast<size_t>(r * cols + j)] = scale * dot(Qs + r * hd, Kg + (klo + j) * kvw, hd);
    else
      ops::sgemm(false, true, R, cols, hd, scale, Qs, hd, Kg + klo * kvw, kvw, 0.0f, S.data(), cols);
    for (int64_t i = i_sink; i < rows; ++i)
      for (int hl = 0; hl < group; ++hl) {
        const int h = g * group + hl;
        for (int64_t j = sink_lo; j < n_sinks; ++j) {
          float& v = SS[(i * group + hl) * n_sinks + j];
          v = scale * dot(q_sink + (r0 + i) * qw + h * hd, Kg + j * kvw, hd);
          if (slopes) v -= slopes[h] * static_cast<float>(cap - 1 - j);
        }
      }
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t pos = p0 + r0 + i;
      const int64_t visible = pos + 1;  // causal mask
      const int64_t lo = first_key(pos);
      for (int hl = 0; hl < group; ++hl) {
        const int64_t r = i * group + hl;
        float* row = S.data() + r * cols;  // column j − klo is key j
        if (slopes) {
          const float m = slopes[g * group + hl];
          for (int64_t j = lo; j < visible; ++j) row[j - klo] -= m * static_cast<float>(pos - j);
        }
        // Unnormalized e^(S − max) here; the output row is divided by the sum after P·V (hd
        // divisions instead of n_keys). The attention mass needs the probabilities themselves.
        float sum;
        if (i >= i_sink && sink_lo < n_sinks) {
          float* srow = SS + r * n_sinks;
          float m = ops::max_element(row + (lo - klo), static_cast<int>(visible - lo));
          for (int64_t j = sink_lo; j < n_sinks; ++j) m = std::max(m, srow[j]);
          sum = ops::exp_shifted_row(row + (lo - klo), static_cast<int>(visible - lo), m);
          sum += ops::exp_shifted_row(srow + sink_lo, static_cast<int>(n_sinks - sink_lo), m);
        } else {
          sum = ops::exp_shifted_row(row + (lo - klo), static_cast<int>(visible - lo));
        }
        inv[r] = 1.0f / sum;
        std::fill(row, row + (lo - klo), 0.0f);
        std::fill(row + (visible - klo), row + cols, 0.0f);
        if (mass)
          for (int64_t j = lo; j < visible; ++j) (*mass)[static_cast<size_t>(j)] += row[j - klo] * inv[r];
      }
    }
    // O_s[R, hd] = P[R, cols] · V_g[klo … n_keys−1, hd] (+ the sinks' P · V), P = e^(S − max) / sum
    if (rows == 1)
      for (int64_t r = 0; r < R; ++r) weighted_sum(S.data() + r * cols, Vg + klo * kvw, kvw, cols, hd, Os + r * hd);
    else
      ops::sgemm(false, false, R, hd, cols, 1.0f, S.data(), cols, Vg + klo * kvw, kvw, 0.0f, Os, hd);
    for (int64_t r = i_sink * group; r < R; ++r)
      for (int64_t j = sink_lo; j < n_sinks; ++j) {
        const float p = SS[r * n_sinks + j];
        const float* vj = Vg + j * kvw;
        float* o = Os + r * hd;
#pragma omp simd
        for (int64_t e = 0; e < hd; ++e) o[e] += p * vj[e];
      }
    // out row r0 + i, head g·group + hl = O_s row i·group + hl / sum (one contiguous span per row)
    for (int64_t i = 0; i < rows; ++i) {
      float* o = out + (r0 + i) * qw + int64_t(g) * group * hd;
      for (int hl = 0; hl < group; ++hl) {
        const float* src = Os + (i * group + hl) * hd;
        const float w = inv[i * group + hl];
#pragma omp simd
        for (int64_t e = 0; e < hd; ++e) o[hl * hd + e] = src[e] * w;
      }
    }
  }
}

}  // namespace sq
