#include "formats/gguf_architecture.h"

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

const GgufArchitecture* const kArchitectures[] = {&kLlama};

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

}  // namespace sq
