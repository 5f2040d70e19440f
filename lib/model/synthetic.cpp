#include "model/synthetic.h"

#include <cmath>
#include <random>

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

namespace {
/// Fills an owned tensor with N(mean, std²) values from a per-tensor seed (parallel-friendly).
Tensor random_tensor(std::vector<int64_t> shape, float mean, float std, uint64_t seed) {
  Tensor t = Tensor::zeros(std::move(shape));
  float* p = t.mutable_data();
  const int64_t n = t.numel();
  constexpr int64_t kBlock = 1 << 16;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < (n + kBlock - 1) / kBlock; ++b) {
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(b));
    std::normal_distribution<float> dist(mean, std);
    const int64_t end = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; ++i) p[i] = dist(rng);
  }
  return t;
}
}  // namespace

Checkpoint make_synthetic_checkpoint(const ModelConfig& c, uint64_t seed) {
  Checkpoint ck;
  ck.config = c;
  ck.source = "synthetic";
  ck.format = "synthetic";
  const int64_t d = c.dim, q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim, h = c.hidden_dim;
  uint64_t s = seed;
  auto linear = [&](int64_t out, int64_t in) { return random_tensor({out, in}, 0.0f, 1.0f / std::sqrt(float(in)), ++s); };
  auto norm = [&]() { return random_tensor({d}, 1.0f, 0.02f, ++s); };
  ck.tensors[names::kEmbed] = random_tensor({c.vocab_size, d}, 0.0f, 1.0f, ++s);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = names::layer(l);
    ck.tensors[p + "input_layernorm.weight"] = norm();
    ck.tensors[p + "self_attn.q_proj.weight"] = linear(q, d);
    ck.tensors[p + "self_attn.k_proj.weight"] = linear(kv, d);
    ck.tensors[p + "self_attn.v_proj.weight"] = linear(kv, d);
    ck.tensors[p + "self_attn.o_proj.weight"] = linear(d, q);
    ck.tensors[p + "post_attention_layernorm.weight"] = norm();
    ck.tensors[p + "mlp.gate_proj.weight"] = linear(h, d);
    ck.tensors[p + "mlp.up_proj.weight"] = linear(h, d);
    ck.tensors[p + "mlp.down_proj.weight"] = linear(d, h);
  }
  ck.tensors[names::kFinalNorm] = norm();
  if (!c.tied_embeddings) ck.tensors[names::kLmHead] = linear(c.vocab_size, d);
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
