// Hyper-parameters of a LLaMA-family decoder, independent of the file format it came from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sq {

/// How rotary position embedding pairs the channels of one head (head_dim d).
enum class RopeLayout {
  /// llama2.c / Meta original: pairs (2i, 2i+1), i in [0, d/2).
  Interleaved,
  /// Hugging Face `rotate_half`: pairs (i, i + d/2), i in [0, d/2). HF checkpoints store q/k
  /// projections row-permuted for this layout.
  HalfSplit,
};

/// "interleaved" / "half-split".
const char* rope_layout_name(RopeLayout layout);

/// How RoPE's per-pair inverse frequencies are derived from the base θ: transformers'
/// `rope_type` (modeling_rope_utils.py, ROPE_INIT_FUNCTIONS). core/rope_frequencies.h computes them.
enum class RopeScalingType {
  Default,  ///< plain RoPE (Su et al. 2021): inv_freq_i = θ^(−2i/d)
  Linear,   ///< position interpolation (Chen et al. 2023): inv_freq_i = θ^(−2i/d) / factor
  Llama3,   ///< Llama 3.1 (Meta 2024): low frequencies / factor, high kept, smooth in between
};

/// "default" / "linear" / "llama3" (the `rope_type` strings of transformers).
const char* rope_scaling_type_name(RopeScalingType type);

/// RoPE frequency scaling parameters (transformers' `rope_parameters` / legacy `rope_scaling`).
/// Fields a type does not use keep their defaults, so two equal scalings compare equal.
/// All three supported types have attention_factor 1 in transformers: scaling changes only the
/// rotation angles, never the softmax temperature.
struct RopeScaling {
  RopeScalingType type = RopeScalingType::Default;
  float factor = 1.0f;           ///< linear, llama3: frequency (= context) scale factor
  float low_freq_factor = 1.0f;  ///< llama3: wavelengths above original_max_position_embeddings / this are divided by factor
  float high_freq_factor = 4.0f; ///< llama3: wavelengths below original_max_position_embeddings / this are kept
  int original_max_position_embeddings = 8192;  ///< llama3: the pre-training context length (tokens)

  bool is_default() const { return type == RopeScalingType::Default; }
  // Spelled out (not "= default"): nvcc compiles this header as C++17.
  bool operator==(const RopeScaling& o) const {
    return type == o.type && factor == o.factor && low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor && original_max_position_embeddings == o.original_max_position_embeddings;
  }
  bool operator!=(const RopeScaling& o) const { return !(*this == o); }
};

/// Normalization of the decoder (every norm of a model uses the same kind).
enum class NormKind {
  /// RMSNorm (Zhang & Sennrich 2019): y = x / sqrt(mean(x²) + eps) · w. Gemma's (1 + w) form is
  /// stored with 1 + w folded into w by its architecture file (bit-identical in FP32).
  RMSNorm,
  /// LayerNorm (Ba et al. 2016): y = (x − mean) / sqrt(var + eps) · w + b (b absent = 0).
  LayerNorm,
};

/// How a token's position enters the model.
enum class PositionKind {
  Rope,     ///< rotary embedding of q and k (RoFormer), see rope_* fields
  Alibi,    ///< ALiBi (Press et al. 2022): score bias −slope_h · (i − j), no position in the weights
  Learned,  ///< learned absolute position embedding added to the token embedding (GPT-2, OPT)
};

/// The feed-forward block's nonlinearity.
enum class Activation {
  SiLU,      ///< x · σ(x) (SwiGLU when gated)
  GeluTanh,  ///< GELU, tanh approximation (`gelu_new`, `gelu_pytorch_tanh`; GeGLU when gated)
  Gelu,      ///< GELU, exact erf form
  ReLU,      ///< max(x, 0)
};

/// "rmsnorm"/"layernorm", "rope"/"alibi"/"learned", "silu"/"gelu_tanh"/"gelu"/"relu".
const char* norm_kind_name(NormKind k);
const char* position_kind_name(PositionKind k);
const char* activation_name(Activation a);

/// The description of one decoder layer's structure: every architecture sqkit runs is the one
/// decoder of lib/model/decoder.h configured by these fields (issue 16). Defaults describe LLaMA:
/// pre-RMSNorm, RoPE, GQA without biases, SwiGLU, sequential residual, no embedding scale.
/// Per layer, in order (x the residual stream [n, dim]):
///   h = norm(x; attn_norm)
///   q, k, v = h·Wqᵀ (+bq), h·Wkᵀ (+bk), h·Wvᵀ (+bv);  qk_norm: RMSNorm per head of q and k
///   RoPE on the first rope_dim channels of every q/k head (PositionKind::Rope)
///   a = o_proj(softmax(attn_scale · q·kᵀ (+ ALiBi bias), causal, window of the layer) · v) (+bo)
///   post_attn_norm: a = norm(a; attn_post_norm)
///   sequential: x += a;  m = mlp(norm(x; ffn_norm));  post_ffn_norm: m = norm(m); x += m
///   parallel:   m = mlp(shared_input_norm ? h : norm(x; ffn_norm));  x += a + m
///   mlp(u) = down(act(gate(u)) ⊙ up(u)) when gated, else down(act(up(u))); biases when mlp_bias;
///   with n_experts > 0: the gated MLP of the top experts_per_token experts by router softmax,
///   weighted by their renormalized probabilities (Mixtral, Jiang et al. 2024 Eq. 1-2).
struct DecoderSpec {
  NormKind norm = NormKind::RMSNorm;
  bool norm_bias = false;          ///< LayerNorm biases on every norm (input, FFN, final, embedding)
  bool post_attn_norm = false;     ///< norm on the attention output before the residual add (Gemma 2/3)
  bool post_ffn_norm = false;      ///< norm on the FFN output before the residual add (Gemma 2/3)
  bool qk_norm = false;            ///< RMSNorm over head_dim of every q and k head, before RoPE (Gemma 3)
  bool parallel_residual = false;  ///< attention and FFN read the same x (GPT-J, GPT-NeoX, Falcon)
  bool shared_input_norm = false;  ///< parallel block with one input norm for attention and FFN (Falcon-7B)
  PositionKind position = PositionKind::Rope;
  int rope_dim = 0;                ///< rotated channels per head (partial rotary); 0 = head_dim
  int learned_position_offset = 0;  ///< row of position p in the position table is p + offset (OPT: 2)
  float attn_scale = 0.0f;         ///< softmax scale of q·kᵀ; 0 = 1/sqrt(head_dim)
  bool o_bias = false;             ///< attention output projection has a bias
  bool mlp_gated = true;           ///< gate ⊙ up (SwiGLU/GeGLU) vs a plain two-layer MLP
  Activation activation = Activation::SiLU;
  bool mlp_bias = false;           ///< FFN projections have biases
  int n_experts = 0;               ///< mixture of experts when > 0 (router + gated experts)
  int experts_per_token = 0;       ///< top-k experts per token
  float embed_scale = 1.0f;        ///< token embedding multiplied by this (Gemma: sqrt(dim) in FP32)
  bool embed_norm = false;         ///< norm right after the embedding (BLOOM word_embeddings_layernorm)
  /// Per-layer sliding-window size in tokens (query i sees keys j with i − window < j ≤ i); empty
  /// = every layer global; 0 entries are global layers (Gemma 3 mixes both).
  std::vector<int> layer_window;
  /// RoPE base of the sliding-window layers when it differs from rope_theta (Gemma 3: 10,000 on
  /// local layers, 1e6 on global ones); 0 = rope_theta. RoPE scaling applies to global layers only.
  float rope_local_theta = 0.0f;

  bool operator==(const DecoderSpec& o) const;
  bool operator!=(const DecoderSpec& o) const { return !(*this == o); }
};

/// Architecture hyper-parameters of a decoder-only model (LLaMA and every architecture of
/// DecoderSpec). All sizes are counts (not bytes). Invariants are checked by `validate()`.
struct ModelConfig {
  std::string architecture = "llama";  ///< the architecture file that built it ("llama", "mistral", "qwen2", "opt", "gemma3", ...)
  DecoderSpec spec;         ///< the layer structure (defaults: LLaMA)
  int dim = 0;              ///< hidden size (embedding width)
  int hidden_dim = 0;       ///< FFN intermediate size (per expert with MoE)
  int n_layers = 0;         ///< decoder layers
  int n_heads = 0;          ///< query heads
  int n_kv_heads = 0;       ///< key/value heads (grouped-query attention when < n_heads)
  int head_dim = 0;         ///< per-head width; dim / n_heads unless the config says otherwise
  int vocab_size = 0;       ///< rows of the token embedding and the LM head
  int max_seq_len = 0;      ///< trained context length (tokens)
  float norm_eps = 1e-5f;   ///< RMSNorm epsilon
  float rope_theta = 10000.0f;  ///< RoPE base θ
  RopeScaling rope_scaling;     ///< RoPE frequency scaling (Default: plain RoPE); see core/rope_frequencies.h
  RopeLayout rope_layout = RopeLayout::Interleaved;
  bool tied_embeddings = true;  ///< LM head shares the token-embedding matrix
  bool qkv_bias = false;        ///< q/k/v projections have biases (Qwen2)
  int bos_id = 1;
  int eos_id = 2;

  /// Throws InputError naming `source` and the offending field when a size is non-positive or
  /// inconsistent (n_heads % n_kv_heads != 0, odd head_dim, ...), or a RoPE scaling parameter is
  /// out of its domain (factor not finite and positive; llama3: low_freq_factor not positive,
  /// high_freq_factor <= low_freq_factor, original_max_position_embeddings not positive).
  void validate(const std::string& source) const;

  /// Number of parameters implied by the shapes (embedding counted once when tied).
  int64_t parameter_count() const;

  /// Sliding-window size of layer `l` in tokens, 0 for a global layer.
  int window(int l) const { return spec.layer_window.empty() ? 0 : spec.layer_window[static_cast<size_t>(l)]; }
  /// Rotated channels per head: spec.rope_dim, or head_dim when 0.
  int rope_dim() const { return spec.rope_dim > 0 ? spec.rope_dim : head_dim; }
  /// True for the plain LLaMA structure (DecoderSpec defaults, the only one the LLaMA baseline and
  /// sq-bench's decoder suite handle).
  bool is_llama_structure() const { return spec == DecoderSpec{}; }
  /// Throws UnsupportedError "<what> supports only the LLaMA layer structure so far; architecture
  /// '<architecture>' is not" (one line) unless is_llama_structure(): the refusal of every part of
  /// sqkit not yet driven by the DecoderSpec.
  void require_llama_structure(const std::string& what) const;

  /// Every field equal (floats compared by value, the spec with DecoderSpec::operator==).
  bool operator==(const ModelConfig& o) const;
  bool operator!=(const ModelConfig& o) const { return !(*this == o); }
};

}  // namespace sq
