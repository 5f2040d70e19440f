// The structure of one decoder layer, written once for every device (issue 41): which op runs when,
// as the model's DecoderSpec (core/model_config.h) says, over a backend that supplies the ops. The
// CPU Decoder (model/decoder.cpp, ops/ops.h) and the CUDA decoder (cuda/cuda_decoder.h,
// cuda/cuda_ops.h) both run their layers through run_decoder_layer, so every architecture that runs
// on one device runs on the other with no per-architecture code on either (CTranslate2's layout:
// device-neutral model code over per-device op implementations).
//
// Per layer, x the residual stream [n, dim] (DecoderSpec's comment has the same list):
//   h = norm(x; attn_norm); q, k, v = linears(h); qk_norm: RMSNorm per head of q and k
//   att = backend.attend(l): RoPE of q (and k), the KV-cache write, causal attention (window, ALiBi,
//         scale) — the one step whose implementation is wholly the backend's (cache formats,
//         streaming eviction and fused decode kernels differ per device)
//   a = o_proj(att); post_attn_norm: a = norm(a)
//   sequential: x += a; m = mlp(norm(x; ffn_norm)); post_ffn_norm: m = norm(m); x += m
//   parallel:   m = mlp(shared_input_norm ? h : norm(x; ffn_norm)); x += a + m (mlp + a added first)
//   mlp(u) = down(act(gate(u)) ⊙ up(u)) (gated) or down(act(up(u))); mixture of experts: the
//   renormalized top-k experts of the router softmax (Mixtral, Jiang et al. 2024 Eq. 1–2).
//
// A backend B provides (every float* is memory of B's device; rows are row-major [n, width]):
//   using Layer;   weights with DecoderLayer's member names (norm tensors, linear pointers, experts)
//   using Linear;  the type Layer's linear pointers point to
//   LayerBuffers buffers(int64_t n);        scratch for n rows (see LayerBuffers)
//   void norm(const float* x, const W& w, const W& b, float* y, int64_t rows, int width);  spec.norm
//   void rms_norm(float* x, const W& w, int64_t rows, int width);                  in place (QK-norm)
//   void add_norm(float* x, const float* r, const W& w, const W& b, float* y, int64_t rows, int width);
//   void linear(const Linear& f, const float* x, int64_t rows, float* y);
//   void linears(std::initializer_list<std::pair<const Linear*, float*>>, const float* x, int64_t rows);
//   void attend(int l, int64_t n);           q, k, v of buffers() → buffers().att
//   void add(float* y, const float* x, int64_t count);
//   void activation(float* x, int64_t count); void gated_activation(float* gate, const float* up, int64_t count);
//   const float* host_rows(const float* x, int64_t count);   x readable on the host (MoE routing)
//   void zero(float* y, int64_t count);
//   void gather_rows(const float* x, const std::vector<int32_t>& rows, int width, float* out);
//   void scatter_add_rows(float* y, const float* src, const std::vector<int32_t>& rows,
//                         const std::vector<float>& weights, int width);   y[rows[i]] += src[i]·w[i]
//   bool observing() const; observe_input / observe_output / observe_kv (ActivationObserver hooks)
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/model_config.h"
#include "model/observer.h"
#include "ops/ops.h"

namespace sq {

/// Scratch of one layer, on the backend's device: xn, proj, proj2 [n, dim]; q, att [n,
/// n_heads·head_dim]; k, v [n, n_kv_heads·head_dim]; gate, up [n, hidden_dim]; for a mixture of
/// experts also router [n, n_experts] and moe_x, moe_out [n, dim].
struct LayerBuffers {
  float *xn = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *att = nullptr, *proj = nullptr, *proj2 = nullptr,
        *gate = nullptr, *up = nullptr, *router = nullptr, *moe_x = nullptr, *moe_out = nullptr;
};

/// Mixture-of-experts routing weights (Mixtral, Jiang et al. 2024 §2.1; transformers
/// MixtralSparseMoeBlock): per token t, p = softmax(router_logits[t]); the top `k` experts by p
/// (ties: the lower index, torch.topk's order) get p_e / Σ_topk p, the others 0. router_logits
/// [n, n_experts] host, overwritten with the probabilities. Returns weights [n, n_experts].
inline std::vector<float> moe_routing_weights(float* router_logits, int64_t n, int n_experts, int k) {
  std::vector<float> weight(static_cast<size_t>(n * n_experts), 0.0f);
  std::vector<int> order(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < n; ++t) {
    float* p = router_logits + t * n_experts;
    ops::softmax_row(p, n_experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum += p[order[static_cast<size_t>(i)]];
    for (int i = 0; i < k; ++i) {
      const int e = order[static_cast<size_t>(i)];
      weight[static_cast<size_t>(t * n_experts + e)] = p[e] / sum;
    }
  }
  return weight;
}

namespace layer_flow {

/// y [n, dim] = the mixture-of-experts FFN of layer l on h [n, dim]: each expert runs on the tokens
/// routed to it (gathered), its output is added to theirs weighted by the routing weight; experts
/// in index order, so every device sums in the same order.
template <class B>
void experts(const ModelConfig& c, int l, const typename B::Layer& L, B& be, const LayerBuffers& s, const float* h, float* y,
             int64_t n) {
  const int E = c.spec.n_experts;
  const int64_t d = c.dim, hid = c.hidden_dim;
  if (be.observing()) be.observe_input(l, ActivationSite::FfnInput, h, n, d);
  be.linear(*L.router, h, n, s.router);  // [n, E]
  const float* router_host = be.host_rows(s.router, n * E);
  std::vector<float> logits(router_host, router_host + n * E);
  const std::vector<float> weight = moe_routing_weights(logits.data(), n, E, c.spec.experts_per_token);
  be.zero(y, n * d);
  std::vector<int32_t> rows;
  std::vector<float> w;
  for (int e = 0; e < E; ++e) {
    rows.clear();
    w.clear();
    for (int64_t t = 0; t < n; ++t)
      if (const float wt = weight[static_cast<size_t>(t * E + e)]; wt != 0.0f) {
        rows.push_back(static_cast<int32_t>(t));
        w.push_back(wt);
      }
    const int64_t m = static_cast<int64_t>(rows.size());
    if (m == 0) continue;
    const auto& X = L.experts[static_cast<size_t>(e)];
    be.gather_rows(h, rows, static_cast<int>(d), s.moe_x);
    be.linears({{X.gate_proj.get(), s.gate}, {X.up_proj.get(), s.up}}, s.moe_x, m);
    be.gated_activation(s.gate, s.up, m * hid);
    // ffn_hidden of an MoE layer pools every expert's down_proj input (a token once per expert it is routed to)
    if (be.observing()) be.observe_input(l, ActivationSite::FfnHidden, s.gate, m, hid);
    be.linear(*X.down_proj, s.gate, m, s.moe_out);
    be.scatter_add_rows(y, s.moe_out, rows, w, static_cast<int>(d));
  }
}

/// y [n, dim] = the FFN of layer l on h [n, dim] (gated or plain MLP, or a mixture of experts).
template <class B>
void mlp(const ModelConfig& c, int l, const typename B::Layer& L, B& be, const LayerBuffers& s, const float* h, float* y,
         int64_t n) {
  const DecoderSpec& sp = c.spec;
  const int64_t d = c.dim, hid = c.hidden_dim;
  if (sp.n_experts > 0) {
    experts(c, l, L, be, s, h, y, n);
    return;
  }
  if (sp.mlp_gated) {
    be.linears({{L.gate_proj.get(), s.gate}, {L.up_proj.get(), s.up}}, h, n);  // [n, hidden] each
    if (be.observing()) {
      be.observe_input(l, ActivationSite::FfnInput, h, n, d);
      be.observe_output(l, Projection::Gate, s.gate, n, hid);
      be.observe_output(l, Projection::Up, s.up, n, hid);
    }
    be.gated_activation(s.gate, s.up, n * hid);
  } else {
    be.linear(*L.up_proj, h, n, s.gate);  // fc1 [n, hidden]
    if (be.observing()) {
      be.observe_input(l, ActivationSite::FfnInput, h, n, d);
      be.observe_output(l, Projection::Up, s.gate, n, hid);
    }
    be.activation(s.gate, n * hid);
  }
  be.linear(*L.down_proj, s.gate, n, y);  // [n, dim]
  if (be.observing()) {
    be.observe_input(l, ActivationSite::FfnHidden, s.gate, n, hid);
    be.observe_output(l, Projection::Down, y, n, d);
  }
}

}  // namespace layer_flow

/// Runs decoder layer l (weights L) of a model with config c on the hidden states x [n, dim] (on
/// the backend's device) in place; the backend's attend() writes the layer's keys/values to its
/// cache. Throws what the backend's ops throw.
template <class B>
void run_decoder_layer(const ModelConfig& c, int l, const typename B::Layer& L, B& be, float* x, int64_t n) {
  const DecoderSpec& sp = c.spec;
  const int dd = c.dim;
  const int64_t d = c.dim, hd = c.head_dim, qw = int64_t(c.n_heads) * hd, kvw = int64_t(c.n_kv_heads) * hd;
  const LayerBuffers s = be.buffers(n);
  // --- attention block on h = norm(x) ---
  be.norm(x, L.attn_norm, L.attn_norm_bias, s.xn, n, dd);
  be.linears({{L.q_proj.get(), s.q}, {L.k_proj.get(), s.k}, {L.v_proj.get(), s.v}}, s.xn, n);  // q[n, qw], k/v[n, kvw]
  if (be.observing()) {
    be.observe_input(l, ActivationSite::AttnInput, s.xn, n, d);
    be.observe_output(l, Projection::Q, s.q, n, qw);
    be.observe_output(l, Projection::K, s.k, n, kvw);
    be.observe_output(l, Projection::V, s.v, n, kvw);
  }
  if (sp.qk_norm) {  // RMSNorm of every head over head_dim (rows of width hd)
    be.rms_norm(s.q, L.q_norm, n * c.n_heads, static_cast<int>(hd));
    be.rms_norm(s.k, L.k_norm, n * c.n_kv_heads, static_cast<int>(hd));
  }
  if (be.observing()) be.observe_kv(l, s.k, s.v, n, kvw);  // keys still pre-RoPE here
  be.attend(l, n);                                         // att[n, qw]
  be.linear(*L.o_proj, s.att, n, s.proj);
  if (be.observing()) {
    be.observe_input(l, ActivationSite::AttnOutput, s.att, n, qw);
    be.observe_output(l, Projection::O, s.proj, n, d);
  }
  if (sp.post_attn_norm) be.norm(s.proj, L.attn_post_norm, L.attn_post_norm_bias, s.proj, n, dd);

  if (sp.parallel_residual) {
    // --- parallel block: x += attn(norm1(x)) + mlp(norm2(x)) (norm2 = norm1 when shared) ---
    if (!sp.shared_input_norm) be.norm(x, L.ffn_norm, L.ffn_norm_bias, s.xn, n, dd);
    layer_flow::mlp(c, l, L, be, s, s.xn, s.proj2, n);
    // transformers adds mlp + attention first, then the residual (GPT-NeoX, Falcon)
    be.add(s.proj2, s.proj, n * d);
    be.add(x, s.proj2, n * d);
    return;
  }
  // --- FFN block: x += [post-norm] mlp(norm(x)), after the attention residual x += proj ---
  be.add_norm(x, s.proj, L.ffn_norm, L.ffn_norm_bias, s.xn, n, dd);
  layer_flow::mlp(c, l, L, be, s, s.xn, s.proj, n);
  if (sp.post_ffn_norm) be.norm(s.proj, L.ffn_post_norm, L.ffn_post_norm_bias, s.proj, n, dd);
  be.add(x, s.proj, n * d);
}

}  // namespace sq
