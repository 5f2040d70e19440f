#include "formats/gguf_architecture.h"

#include <cmath>

namespace sq {

namespace {

using D = GgufDim;

/// `llama` (llama.cpp LLM_ARCH_LLAMA; written by convert_hf_to_gguf.py's Decoder for
/// LlamaForCausalLM checkpoints such as SmolLM2). Key and tensor names: llama.cpp
/// src/llama-arch.cpp (LLM_KV_*, LLM_TENSOR_* for LLM_ARCH_LLAMA) and the GGUF spec.
const GgufArchitecture kLlama{
    "llama",
    "llama",
    {
        {"block_count", &ModelConfig::n_layers, true},
        {"embedding_length", &ModelConfig::dim, true},
        {"feed_forward_length", &ModelConfig::hidden_dim, true},
        {"attention.head_count", &ModelConfig::n_heads, true},
        // GGUF spec: optional, defaults to head_count (no grouped-query attention).
        {"attention.head_count_kv", &ModelConfig::n_kv_heads, false, &ModelConfig::n_heads},
        {"context_length", &ModelConfig::max_seq_len, true},
    },
    {
        {"attention.layer_norm_rms_epsilon", &ModelConfig::norm_eps, true},
        // llama.cpp's default when absent (llama_hparams rope_freq_base_train = 10000).
        {"rope.freq_base", &ModelConfig::rope_theta, false, 10000.0f},
    },
    {
        {"token_embd.weight", "model.embed_tokens.weight", {D::Vocab, D::Dim}},
        {"output_norm.weight", "model.norm.weight", {D::Dim}},
        {"output.weight", "lm_head.weight", {D::Vocab, D::Dim}, /*optional=*/true},
    },
    {
        {"attn_norm.weight", "input_layernorm.weight", {D::Dim}},
        {"attn_q.weight", "self_attn.q_proj.weight", {D::QWidth, D::Dim}, false, GgufQkRows::Query},
        {"attn_k.weight", "self_attn.k_proj.weight", {D::KvWidth, D::Dim}, false, GgufQkRows::Key},
        {"attn_v.weight", "self_attn.v_proj.weight", {D::KvWidth, D::Dim}},
        {"attn_output.weight", "self_attn.o_proj.weight", {D::Dim, D::QWidth}},
        {"ffn_norm.weight", "post_attention_layernorm.weight", {D::Dim}},
        {"ffn_gate.weight", "mlp.gate_proj.weight", {D::Hidden, D::Dim}},
        {"ffn_up.weight", "mlp.up_proj.weight", {D::Hidden, D::Dim}},
        {"ffn_down.weight", "mlp.down_proj.weight", {D::Dim, D::Hidden}},
    },
};

/// Gemma 3's layer structure (transformers Gemma3DecoderLayer; llama.cpp src/models/gemma3.cpp):
/// pre- and post-norms around attention and FFN, RMSNorm per head of q and k before RoPE, GeGLU
/// with the tanh GELU (llama.cpp LLM_FFN_GELU + LLM_FFN_PAR; transformers gelu_pytorch_tanh).
/// Norms are plain RMSNorm: convert_hf_to_gguf.py (Gemma3Model.norm_shift = 1) already stored
/// 1 + w for every "*norm.weight" (input, post-attention, pre/post-FFN, q/k, final), the fold
/// core/model_config.h describes, so the GGUF weights are used as they are.
DecoderSpec gemma3_spec() {
  DecoderSpec s;
  s.norm = NormKind::RMSNorm;
  s.post_attn_norm = true;
  s.post_ffn_norm = true;
  s.qk_norm = true;
  s.position = PositionKind::Rope;
  s.mlp_gated = true;
  s.activation = Activation::GeluTanh;
  return s;
}

/// llama.cpp (load_hparams, LLM_ARCH_GEMMA3), after gemma_pytorch's config.py: q is scaled by
/// 1/sqrt(n_embd / n_head) for the 27B model (62 layers; its query_pre_attn_scalar is
/// hidden_size / num_attention_heads = 168 while head_dim is 128), else by 1/sqrt(head_dim)
/// (query_pre_attn_scalar = head_dim = 256 for 270M, 1B, 4B, 12B). The file stores neither.
float gemma3_attn_scale(const ModelConfig& c) {
  const int scalar = c.n_layers == 62 ? c.dim / c.n_heads : c.head_dim;
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(scalar)));
}

/// `gemma3` (llama.cpp LLM_ARCH_GEMMA3; written by convert_hf_to_gguf.py's Gemma3Model for
/// Gemma3ForCausalLM checkpoints such as Gemma 3 270M). Key and tensor names: llama.cpp
/// src/llama-arch.cpp (LLM_KV_*, LLM_TENSOR_* for LLM_ARCH_GEMMA3). Its q/k rows are NOT permuted:
/// llama.cpp runs Gemma's RoPE in NEOX mode (pairs (i, i + d/2)), which is transformers'
/// rotate_half, so the rows are already in the half-split order.
const GgufArchitecture kGemma3{
    .name = "gemma3",
    .config_architecture = "gemma3",
    .int_keys =
        {
            {"block_count", &ModelConfig::n_layers, true},
            {"embedding_length", &ModelConfig::dim, true},
            {"feed_forward_length", &ModelConfig::hidden_dim, true},
            {"attention.head_count", &ModelConfig::n_heads, true},
            {"attention.head_count_kv", &ModelConfig::n_kv_heads, false, &ModelConfig::n_heads},
            {"context_length", &ModelConfig::max_seq_len, true},
        },
    .float_keys =
        {
            {"attention.layer_norm_rms_epsilon", &ModelConfig::norm_eps, true},
            // The base of the global layers (1e6 for Gemma 3; transformers maps it to rope_theta).
            {"rope.freq_base", &ModelConfig::rope_theta, false, 10000.0f},
        },
    .global_tensors =
        {
            {"token_embd.weight", "model.embed_tokens.weight", {D::Vocab, D::Dim}},
            {"output_norm.weight", "model.norm.weight", {D::Dim}},
            {"output.weight", "lm_head.weight", {D::Vocab, D::Dim}, /*optional=*/true},
        },
    .layer_tensors =
        {
            {"attn_norm.weight", "input_layernorm.weight", {D::Dim}},
            {"attn_q.weight", "self_attn.q_proj.weight", {D::QWidth, D::Dim}},
            {"attn_k.weight", "self_attn.k_proj.weight", {D::KvWidth, D::Dim}},
            {"attn_v.weight", "self_attn.v_proj.weight", {D::KvWidth, D::Dim}},
            {"attn_q_norm.weight", "self_attn.q_norm.weight", {D::HeadDim}},
            {"attn_k_norm.weight", "self_attn.k_norm.weight", {D::HeadDim}},
            {"attn_output.weight", "self_attn.o_proj.weight", {D::Dim, D::QWidth}},
            // LLM_TENSOR_ATTN_POST_NORM (HF post_attention_layernorm: on the attention output).
            {"post_attention_norm.weight", "attn_post_norm.weight", {D::Dim}},
            // LLM_TENSOR_FFN_NORM (HF pre_feedforward_layernorm): the FFN input norm, which is
            // LLaMA's post_attention_layernorm in the canonical names.
            {"ffn_norm.weight", "post_attention_layernorm.weight", {D::Dim}},
            {"ffn_gate.weight", "mlp.gate_proj.weight", {D::Hidden, D::Dim}},
            {"ffn_up.weight", "mlp.up_proj.weight", {D::Hidden, D::Dim}},
            {"ffn_down.weight", "mlp.down_proj.weight", {D::Dim, D::Hidden}},
            // LLM_TENSOR_FFN_POST_NORM (HF post_feedforward_layernorm).
            {"post_ffw_norm.weight", "mlp_post_norm.weight", {D::Dim}},
        },
    .spec = gemma3_spec(),
    // llama.cpp src/models/gemma3.cpp: ggml_scale(inpL, sqrtf(n_embd)); transformers
    // Gemma3TextScaledWordEmbedding: hidden_size**0.5 cast to FP32 (the same FP32 value).
    .embed_scale = GgufEmbedScale::SqrtDim,
    .attn_scale = gemma3_attn_scale,
    // llama.cpp: gemma3.attention.sliding_window (optional in current llama.cpp: absent or 0 = no
    // SWA), set_swa_pattern(6) (5 local layers, then 1 global: transformers' layer_types with
    // sliding_window_pattern 6), rope_freq_base_train_swa = 10000 (transformers'
    // rope_local_base_freq); the global layers use gemma3.rope.freq_base.
    .sliding_window = {.key_suffix = "attention.sliding_window", .pattern = 6, .local_rope_theta = 10000.0f},
    // Written by the converter when the HF config has them (Gemma 2 does; Gemma 3's are null).
    .refused_keys =
        {
            {"final_logit_softcapping", "final logit soft-capping"},
            {"attn_logit_softcapping", "attention logit soft-capping"},
        },
};

/// `qwen2` (llama.cpp LLM_ARCH_QWEN2; written by convert_hf_to_gguf.py's Qwen2Model for
/// Qwen2ForCausalLM checkpoints). llama's keys and tensors with the prefix `qwen2.`, plus the q/k/v
/// biases (LLM_TENSOR_ATTN_Q/K/V with suffix "bias"). llama.cpp runs Qwen2's RoPE in NEOX mode
/// (LLAMA_ROPE_TYPE_NEOX), so the converter writes q/k rows unpermuted (Qwen2Model has no permute;
/// transformers' GGUF loader has no Qwen2 tensor processor): already the half-split order.
/// No sliding window: llama.cpp's qwen2 graph has none (Qwen2's use_sliding_window is false in the
/// released models).
GgufArchitecture make_qwen2() {
  GgufArchitecture a = kLlama;
  a.name = "qwen2";
  a.config_architecture = "qwen2";
  a.qkv_bias = true;
  for (GgufTensorRule& r : a.layer_tensors) r.qk = GgufQkRows::None;
  a.layer_tensors.insert(a.layer_tensors.begin() + 4, {
      {"attn_q.bias", "self_attn.q_proj.bias", {D::QWidth}},
      {"attn_k.bias", "self_attn.k_proj.bias", {D::KvWidth}},
      {"attn_v.bias", "self_attn.v_proj.bias", {D::KvWidth}},
  });
  return a;
}

const GgufArchitecture kQwen2 = make_qwen2();

const GgufArchitecture* const kArchitectures[] = {&kLlama, &kGemma3, &kQwen2};

}  // namespace

const GgufArchitecture* find_gguf_architecture(const std::string& name) {
  for (const GgufArchitecture* a : kArchitectures)
    if (name == a->name) return a;
  return nullptr;
}

std::string supported_gguf_architectures() {
  std::string out;
  for (const GgufArchitecture* a : kArchitectures) out += (out.empty() ? "" : ", ") + std::string(a->name);
  return out;
}

int64_t gguf_dim_size(GgufDim d, const ModelConfig& c) {
  switch (d) {
    case GgufDim::Dim: return c.dim;
    case GgufDim::QWidth: return int64_t(c.n_heads) * c.head_dim;
    case GgufDim::KvWidth: return int64_t(c.n_kv_heads) * c.head_dim;
    case GgufDim::Hidden: return c.hidden_dim;
    case GgufDim::Vocab: return c.vocab_size;
    case GgufDim::HeadDim: return c.head_dim;
  }
  return 0;
}

}  // namespace sq
