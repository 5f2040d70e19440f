#include "bench/llama_baseline.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "core/rope_frequencies.h"
#include "ops/ops.h"

namespace sq::bench {

namespace {
void ensure(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}
}  // namespace

void llama_baseline_forward(const Decoder& model, const int32_t* tokens, int64_t n, KVCache& cache, Workspace& ws, float* logits,
                            LogitsFor which) {
  const ModelConfig& c = model.config();
  c.require_llama_structure("sq-bench's LLaMA baseline");
  const int64_t d = c.dim, hd = c.head_dim, qw = int64_t(c.n_heads) * hd, kvw = int64_t(c.n_kv_heads) * hd, hid = c.hidden_dim;
  const int64_t p0 = cache.length();
  if (n <= 0) return;
  if (p0 + n > cache.capacity()) throw std::length_error("KV cache full");
  static thread_local std::vector<float> inv_freq;
  inv_freq = rope_inv_freq(c);
  for (std::vector<float>* v : {&ws.x, &ws.xn, &ws.proj}) ensure(*v, n * d);
  for (std::vector<float>* v : {&ws.q, &ws.att}) ensure(*v, n * qw);
  for (std::vector<float>* v : {&ws.k, &ws.v}) ensure(*v, n * kvw);
  for (std::vector<float>* v : {&ws.gate, &ws.up}) ensure(*v, n * hid);
  ws.positions.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) ws.positions[static_cast<size_t>(t)] = static_cast<int32_t>(p0 + t);
  float* x = ws.x.data();
  float* xn = ws.xn.data();
  model.embed(tokens, n, x);
  for (int l = 0; l < c.n_layers; ++l) {
    const DecoderLayer& L = model.layers()[static_cast<size_t>(l)];
    ops::rms_norm(x, L.attn_norm.data(), xn, n, static_cast<int>(d), c.norm_eps);
    L.q_proj->forward(xn, n, ws.q.data());
    L.k_proj->forward(xn, n, ws.k.data());
    L.v_proj->forward(xn, n, ws.v.data());
    ops::rope(ws.q.data(), ws.positions.data(), n, c.n_heads, static_cast<int>(hd), inv_freq.data(), c.rope_layout);
    if (!cache.keys_pre_rope())
      ops::rope(ws.k.data(), ws.positions.data(), n, c.n_kv_heads, static_cast<int>(hd), inv_freq.data(), c.rope_layout);
    cache.write(l, ws.k.data(), ws.v.data(), n);
    const KVCache::View kv = cache.read(l, p0 + n, ws.kbuf, ws.vbuf);
    model.attention(ws.q.data(), kv.keys, kv.values, n, p0, ws.att.data(), ws);
    L.o_proj->forward(ws.att.data(), n, ws.proj.data());
    ops::add_inplace(x, ws.proj.data(), n * d);
    ops::rms_norm(x, L.ffn_norm.data(), xn, n, static_cast<int>(d), c.norm_eps);
    L.gate_proj->forward(xn, n, ws.gate.data());
    L.up_proj->forward(xn, n, ws.up.data());
    ops::swiglu(ws.gate.data(), ws.up.data(), n * hid);
    L.down_proj->forward(ws.gate.data(), n, ws.proj.data());
    ops::add_inplace(x, ws.proj.data(), n * d);
  }
  cache.advance(n);
  if (which == LogitsFor::None) return;
  const int64_t first = which == LogitsFor::AllTokens ? 0 : n - 1;
  ops::rms_norm(x + first * d, model.final_norm().data(), xn, n - first, static_cast<int>(d), c.norm_eps);
  model.lm_head().forward(xn, n - first, logits);
}

}  // namespace sq::bench
