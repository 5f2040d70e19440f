#include "model/synthetic.h"

#include <cmath>
#include <random>
#include <stdexcept>

namespace sq {

ModelConfig synthetic_1b_config(int n_layers) {
  ModelConfig c;
  c.architecture = "llama";
  c.dim = 2048;
  c.hidden_dim = 5632;
  c.n_layers = n_layers;
  c.n_heads = 32;
  c.n_kv_heads = 4;
  c.head_dim = 64;
  c.vocab_size = 32000;
  c.max_seq_len = 2048;
  c.norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.rope_layout = RopeLayout::HalfSplit;
  c.tied_embeddings = false;
  return c;
}

ModelConfig synthetic_7b_config(int n_layers) {
  ModelConfig c = synthetic_1b_config(n_layers);
  c.dim = 4096;
  c.hidden_dim = 11008;
  c.n_heads = 32;
  c.n_kv_heads = 32;
  c.head_dim = 128;
  c.norm_eps = 1e-6f;
  return c;
}

namespace {
constexpr int64_t kBlock = 1 << 16;  ///< elements per independently seeded random block

/// Elements [begin, end) (begin a multiple of kBlock) of a tensor of N(mean, std²) values drawn
/// block by block, block b from mt19937_64(seed·φ + b): any piecewise fill gives the same values.
void fill_normal(int64_t begin, int64_t end, float* out, float mean, float std, uint64_t seed) {
  const int64_t first = begin / kBlock, last = (end + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = first; b < last; ++b) {
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(b));
    std::normal_distribution<float> dist(mean, std);
    const int64_t e = std::min(end, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < e; ++i) out[i - begin] = dist(rng);
  }
}
}  // namespace

std::vector<GeneratedTensor> synthetic_tensors(const ModelConfig& c, uint64_t seed) {
  std::vector<GeneratedTensor> out;
  const int64_t d = c.dim, q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim, h = c.hidden_dim;
  uint64_t s = seed;
  auto add = [&](std::string name, std::vector<int64_t> shape, float mean, float std) {
    const uint64_t ts = ++s;
    out.push_back({std::move(name), std::move(shape), [mean, std, ts](int64_t b, int64_t e, float* p) {
                     if (b % kBlock != 0) throw std::invalid_argument("synthetic tensor: piece must start at a multiple of 2^16");
                     fill_normal(b, e, p, mean, std, ts);
                   }});
  };
  auto linear = [&](std::string name, int64_t rows, int64_t in) { add(std::move(name), {rows, in}, 0.0f, 1.0f / std::sqrt(float(in))); };
  auto norm = [&](std::string name) { add(std::move(name), {d}, 1.0f, 0.02f); };
  add(names::kEmbed, {c.vocab_size, d}, 0.0f, 1.0f);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = names::layer(l);
    norm(p + "input_layernorm.weight");
    linear(p + "self_attn.q_proj.weight", q, d);
    linear(p + "self_attn.k_proj.weight", kv, d);
    linear(p + "self_attn.v_proj.weight", kv, d);
    linear(p + "self_attn.o_proj.weight", d, q);
    norm(p + "post_attention_layernorm.weight");
    linear(p + "mlp.gate_proj.weight", h, d);
    linear(p + "mlp.up_proj.weight", h, d);
    linear(p + "mlp.down_proj.weight", d, h);
  }
  norm(names::kFinalNorm);
  if (!c.tied_embeddings) linear(names::kLmHead, c.vocab_size, d);
  return out;
}

Checkpoint make_synthetic_checkpoint(const ModelConfig& c, uint64_t seed) {
  Checkpoint ck;
  ck.config = c;
  ck.source = "synthetic";
  ck.format = "synthetic";
  for (const GeneratedTensor& g : synthetic_tensors(c, seed)) {
    Tensor t = Tensor::zeros(g.shape);
    g.generate(0, t.numel(), t.mutable_data());
    ck.tensors[g.name] = std::move(t);
  }
  return ck;
}

}  // namespace sq

namespace sq {

Checkpoint make_outlier_variant(const Checkpoint& ck, const std::vector<int>& channels, float factor) {
  Checkpoint out = ck;
  out.source = ck.source + " (outlier variant)";
  for (int l = 0; l < ck.config.n_layers; ++l) {
    const std::string p = names::layer(l);
    const std::pair<const char*, std::vector<const char*>> groups[] = {
        {"input_layernorm.weight", {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}},
        {"post_attention_layernorm.weight", {"mlp.gate_proj.weight", "mlp.up_proj.weight"}}};
    for (const auto& [norm, linears] : groups) {
      Tensor g = out.tensors.at(p + norm).clone();
      for (int c : channels) g.mutable_data()[c] *= factor;
      out.tensors[p + norm] = g;
      for (const char* lin : linears) {
        Tensor w = out.tensors.at(p + lin).clone();
        const int64_t rows = w.dim(0), in = w.dim(1);
        for (int64_t r = 0; r < rows; ++r)
          for (int c : channels) w.mutable_data()[r * in + c] /= factor;
        out.tensors[p + lin] = w;
      }
    }
  }
  return out;
}

}  // namespace sq
