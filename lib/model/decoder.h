// The decoder of every architecture sqkit runs: one layer structure configured by the model's
// DecoderSpec (core/model_config.h: norm kind and placement, RoPE / ALiBi / learned positions,
// MHA/GQA/MQA with optional biases, QK-norm and per-layer sliding windows, sequential or parallel
// residual, gated or plain MLP or a mixture of experts, embedding scale and norm), not a subclass
// per architecture. With DecoderSpec's defaults it is the LLaMA decoder (Touvron et al. 2023):
// RMSNorm, RoPE, grouped-query causal attention with a KV cache, SwiGLU FFN, final norm, LM head.
// FP32 activations; projections are `Linear`s (dense or quantized).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/checkpoint.h"
#include "core/model_config.h"
#include "core/tensor.h"
#include "model/linear.h"
#include "model/observer.h"
#include "model/quantized_embedding.h"
#include "ops/packed_storage.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_decode_attention.h"

namespace sq {

/// One expert of a mixture-of-experts FFN: a gated MLP down(act(gate(x)) ⊙ up(x)).
struct Expert {
  std::unique_ptr<Linear> gate_proj;  ///< dim -> hidden_dim
  std::unique_ptr<Linear> up_proj;    ///< dim -> hidden_dim
  std::unique_ptr<Linear> down_proj;  ///< hidden_dim -> dim
};

/// Weights of one decoder layer. Which members are set follows the model's DecoderSpec; the rest
/// are empty tensors / null pointers (a newcomer checks `spec`, not the pointers).
struct DecoderLayer {
  Tensor attn_norm;                 ///< [dim] weight of the norm before attention
  Tensor attn_norm_bias;            ///< [dim] LayerNorm bias (spec.norm_bias)
  std::unique_ptr<Linear> q_proj;   ///< dim -> n_heads*head_dim (rows ordered per config.rope_layout)
  std::unique_ptr<Linear> k_proj;   ///< dim -> n_kv_heads*head_dim
  std::unique_ptr<Linear> v_proj;   ///< dim -> n_kv_heads*head_dim
  Tensor q_norm, k_norm;            ///< [head_dim] per-head RMSNorm weights of q and k (spec.qk_norm)
  std::unique_ptr<Linear> o_proj;   ///< n_heads*head_dim -> dim
  Tensor attn_post_norm, attn_post_norm_bias;  ///< [dim] norm of the attention output (spec.post_attn_norm)
  Tensor ffn_norm;                  ///< [dim] weight of the norm before the FFN (absent with a shared input norm)
  Tensor ffn_norm_bias;             ///< [dim] (spec.norm_bias)
  std::unique_ptr<Linear> gate_proj;  ///< dim -> hidden_dim (llama2.c w1); null for a plain MLP or experts
  std::unique_ptr<Linear> up_proj;    ///< dim -> hidden_dim (llama2.c w3; fc1 of a plain MLP); null with experts
  std::unique_ptr<Linear> down_proj;  ///< hidden_dim -> dim (llama2.c w2; fc2); null with experts
  std::unique_ptr<Linear> router;     ///< dim -> n_experts router logits (spec.n_experts > 0)
  std::vector<Expert> experts;        ///< [n_experts]
  Tensor ffn_post_norm, ffn_post_norm_bias;  ///< [dim] norm of the FFN output (spec.post_ffn_norm)
};

/// Which rows of logits `Decoder::forward` computes.
enum class LogitsFor {
  AllTokens,  ///< [n, vocab]: perplexity, scoring
  LastToken,  ///< [1, vocab]: generation
  None,       ///< no LM head (prefill only)
};

/// Block streaming under a sink/window eviction policy (eval/streaming.cpp, `sq-eval --protocol
/// streaming -b N`): the n queries of one forward() are answered exactly as if they had been decoded
/// one token at a time under a cache of `capacity` rows (runtime/kv_policy.h: sink:S,window:W has
/// capacity S + W, window:W capacity W, S = 0), whose first `sinks` rows are never evicted and whose
/// positions are cache positions (StreamingLLM §3.2). A query at cache position pos < capacity has
/// evicted nothing and sees rows 0 … pos. A query at pos ≥ capacity stands, in the token-by-token
/// cache, at position capacity − 1 with the sinks at 0 … S−1 and its W − 1 predecessors right
/// before it; here it sees
///   - rows pos − W + 1 … pos (the same keys at the same distances: RoPE and ALiBi are relative),
///   - the sink rows 0 … S−1 scored as from position capacity − 1: its query rotated there
///     (Workspace::q_sink) and an ALiBi distance of capacity − 1 − s,
/// and a sliding-window layer of w tokens hides sink s unless capacity − 1 − s < w, as it would.
/// The caller keeps the sinks and the latest capacity − S − 1 rows before each forward() (the state
/// the token-by-token cache holds before the block's first token). capacity 0 = off (ordinary
/// causal attention).
struct BlockEviction {
  int64_t capacity = 0;  ///< C: rows the token-by-token cache holds at most (0 = off)
  int64_t sinks = 0;     ///< S: first rows never evicted (0 for window:W)
};

/// One sequence's block in a batched forward (Decoder::forward_batch): `n` tokens that continue
/// `cache` at its positions cache->length() … cache->length() + n − 1.
struct SequenceBlock {
  const int32_t* tokens = nullptr;  ///< [n] token ids
  int64_t n = 0;
  KVCache* cache = nullptr;
};

/// What Decoder::forward_batch does with the key/value rows it wrote.
enum class BatchRows {
  Keep,     ///< every block's cache is advanced by its n (each block has a cache of its own)
  Discard,  ///< the rows are dropped again (each cache truncated to its length before the call):
            ///< blocks may share a cache, each an alternative continuation of it (several endings of
            ///< one prefix, eval/hellaswag.h)
};

/// Scratch buffers of one forward pass; reuse one per thread across calls to avoid allocation.
struct Workspace {
  std::vector<float> x, xn, q, k, v, att, proj, gate, up;
  std::vector<float> proj2;  ///< FFN output of a parallel block / post-norm scratch [n, dim]
  std::vector<float> moe_x, moe_out, router_logits;  ///< mixture-of-experts gather / scatter buffers
  std::vector<int32_t> moe_rows;                      ///< token rows routed to the current expert
  std::vector<float> kbuf, vbuf;  ///< dequantized keys/values of one layer (quantized KV caches)
  /// When set, attention adds, for every cache row j, Σ over layers, heads and the block's queries
  /// of the softmax probability P[i, j] to (*attention_mass)[j] (resized to the cache length).
  /// H2O / Q-Hitter accumulate it over decode steps. Attention then runs on one thread.
  std::vector<double>* attention_mass = nullptr;
  std::vector<int32_t> positions;
  /// Per worker thread: attention scores [query block × group, keys] and its stacked queries/outputs.
  std::vector<std::vector<float>> scores;
  /// Decode steps (n == 1) over a nuq cache use the fused kernel of runtime/kv_decode_attention.h
  /// (reads the packed rows); false forces KVCache::read + sgemm attention (tests, benchmarks).
  bool fused_decode_attention = true;
  KVDecodeScratch kv_decode;  ///< buffers of the fused kernel
  /// RoPE angles of the current forward's positions (ops::rope_table, [n, rot_dim/2] each) for the
  /// frequencies in rope_freq; layers with the same frequencies reuse them. prepare() empties
  /// rope_freq (new positions).
  std::vector<float> rope_cos, rope_sin, rope_freq;
  /// Block streaming (see BlockEviction); off by default.
  BlockEviction eviction;
  /// [n, n_heads·head_dim] queries rotated at min(position, eviction.capacity − 1): what the block's
  /// queries score the sink rows with (RoPE models under `eviction`; unused otherwise).
  std::vector<float> q_sink;
};

/// Tensors outside the layers besides the token embedding and final norm weight; which are set
/// follows the DecoderSpec (empty tensors otherwise).
struct DecoderGlobals {
  Tensor final_norm_bias;   ///< [dim] (spec.norm_bias)
  Tensor embed_norm;        ///< [dim] norm right after the embedding (spec.embed_norm)
  Tensor embed_norm_bias;   ///< [dim]
  Tensor embed_positions;   ///< [max_seq_len + offset, dim] learned positions (PositionKind::Learned)
};

/// A decoder ready to run (any DecoderSpec).
class Decoder {
 public:
  Decoder(ModelConfig config, Tensor embed, std::vector<DecoderLayer> layers, Tensor final_norm,
             std::unique_ptr<Linear> lm_head, DecoderGlobals globals = {});

  /// Builds an FP32 model (DenseLinear everywhere) from a checkpoint's canonical tensors
  /// (core/checkpoint.h), reading the tensors its config's DecoderSpec implies.
  /// Throws InputError naming the checkpoint and tensor when one is missing or mis-shaped.
  static Decoder from_checkpoint(const Checkpoint& checkpoint);
  /// A decoder of the checkpoint's global tensors (embedding, final norm, LM head, DecoderGlobals)
  /// whose config.n_layers layers are empty placeholders: for embed() and forward_layer() with the
  /// layers supplied per call (layer_from_checkpoint), when the whole model does not fit in memory.
  /// forward() must not be called on it. Throws InputError as from_checkpoint for a global tensor.
  static Decoder from_checkpoint_globals(const Checkpoint& checkpoint);
  /// Layer `l` (FP32, DenseLinear) from a checkpoint holding at least that layer's tensors.
  /// Throws InputError as from_checkpoint for a missing or mis-shaped tensor.
  static DecoderLayer layer_from_checkpoint(const Checkpoint& checkpoint, int l);

  const ModelConfig& config() const { return config_; }
  const std::vector<DecoderLayer>& layers() const { return layers_; }
  /// FP32 token embedding [vocab, dim]; empty when the embedding is stored quantized.
  const Tensor& embedding() const { return embed_; }
  /// Stores the token embedding as symmetric INT8 rows instead: q [vocab, dim] row-major,
  /// scales [vocab] (row r dequantizes as q[r, :] · scales[r]). Lookups dequantize one row per
  /// token; nothing else changes. Throws std::invalid_argument on a size mismatch.
  void set_quantized_embedding(ops::Int8Codes q, std::vector<float> scales);
  /// Stores the token embedding as group-wise INT4 rows (w: [vocab, dim], quant/int4_quantize.h)
  /// instead; lookups dequantize one row per token. Throws std::invalid_argument on a shape mismatch
  /// or invalid weights (validate_int4).
  void set_quantized_embedding(Int4Weights w);
  /// The quantized embedding (empty when the FP32 embedding() is used).
  const QuantizedEmbedding& quantized_embedding() const { return embed_q_; }
  const Tensor& final_norm() const { return final_norm_; }
  const DecoderGlobals& globals() const { return globals_; }
  /// [n_heads] ALiBi slopes (Press et al. 2022 §3: the geometric sequence 2^(−8h/n) for n a power of
  /// two, BLOOM's interleaving otherwise); empty unless PositionKind::Alibi.
  const std::vector<float>& alibi_slopes() const { return alibi_slopes_; }
  const Linear& lm_head() const { return *lm_head_; }
  /// False for a layer-streamed model's globals without their untied head (model/layer_stream.h).
  bool has_lm_head() const { return lm_head_ != nullptr; }
  /// Rotates queries and keys per head after RoPE with the block-diagonal Walsh–Hadamard rotation
  /// of `block` channels (ops/hadamard.h; QuaRot §3, SpinQuant's R3) whenever the KV cache quantizes
  /// keys stored after RoPE, so that the cache holds rotated keys: R is orthogonal, so the attention
  /// scores (R·q)·(R·k) = q·k are unchanged up to FP32 rounding, while a key's outlier channels are
  /// spread over its block before it is quantized. FP32 caches and caches of pre-RoPE keys are left
  /// as they are. 0 turns it off. Throws std::invalid_argument unless block is 0 or a power of two
  /// dividing head_dim.
  void set_key_rotation(int64_t block);
  /// The block of set_key_rotation (0: none).
  int64_t key_rotation() const { return key_rotation_; }

  /// Runs `n` tokens at positions cache.length() … cache.length()+n−1 (one block: prefill when
  /// n > 1, decode when n == 1), appends their keys/values to `cache`, and writes logits:
  /// [n, vocab] for AllTokens, [1, vocab] (of the last token) for LastToken, nothing for None.
  /// `observer`, when given, sees every linear's input and output and the pre-RoPE keys/values.
  /// Throws std::out_of_range if a token id is outside the vocabulary and std::length_error if the
  /// cache has no room for n more positions.
  void forward(const int32_t* tokens, int64_t n, KVCache& cache, Workspace& ws, float* logits, LogitsFor which,
               ActivationObserver* observer = nullptr) const;
  /// forward() that computes the logits of rows `first_row` … n−1 only: logits [n − first_row,
  /// vocab] row-major (row r is token first_row + r). For protocols that score the tail of a chunk
  /// (llama.cpp's perplexity scores positions ctx/2 … ctx−2): the LM head of the other rows is
  /// skipped. first_row = 0 is forward(AllTokens), n − 1 is forward(LastToken). Throws
  /// std::out_of_range when first_row is outside [0, n), and as forward().
  void forward_tail(const int32_t* tokens, int64_t n, int64_t first_row, KVCache& cache, Workspace& ws, float* logits,
                    ActivationObserver* observer = nullptr) const;

  /// Runs several sequences' blocks as one batch: embeddings, norms, linears and the LM head on all
  /// R = Σ n_b rows at once (one GEMM per linear, so the weights are read once per batch), RoPE, the
  /// KV write and attention per block, blocks in order. Block b sees its cache's rows before the call
  /// plus its own rows (blocks sharing a cache under BatchRows::Discard write their rows over each
  /// other's in turn, after the earlier block's attention of that layer read them). `logits`: [R,
  /// vocab] for AllTokens (blocks in order), [B, vocab] (each block's last token) for LastToken,
  /// nothing for None. Each block's logits equal forward()'s on the same cache up to the FP32
  /// rounding of GEMMs of another row count. Throws std::invalid_argument for an empty block or
  /// cache, a cache shared under BatchRows::Keep, or caches that store keys differently (pre/post
  /// RoPE); std::logic_error with block streaming (ws.eviction) or attention-mass tracking
  /// (ws.attention_mass) on more than one block; and as forward().
  void forward_batch(const std::vector<SequenceBlock>& blocks, BatchRows rows, Workspace& ws, float* logits,
                     LogitsFor which) const;

  /// x [n, dim] row-major = the input of layer 0 for `tokens` at text positions first_position …:
  /// the embedding rows (dequantized when the embedding is INT8) × spec.embed_scale, plus the
  /// learned position rows (PositionKind::Learned), then the embedding norm (spec.embed_norm).
  /// forward() passes the cache length p0: a token's learned position is the cache row it is
  /// written to, which equals its text position until a streaming policy evicts rows, and then
  /// stays inside the trained table (docs/protocols.md, streaming on learned positions). Throws
  /// std::out_of_range for a token id outside the vocabulary and std::length_error for a position
  /// beyond a learned position table.
  void embed(const int32_t* tokens, int64_t n, float* x, int64_t first_position = 0) const;
  /// Runs one decoder layer `l` with weights `L` (normally layers()[l]; a converter may pass a
  /// quantized replacement) on the hidden states x [n, dim] in place, for positions
  /// cache.length() … cache.length()+n−1, writing that layer's keys/values into `cache` without
  /// advancing it (forward() advances once after all layers). Layer-by-layer calibration (GPTQ's
  /// sequential quantization) runs every window through layer l before moving to l+1.
  /// Throws std::out_of_range for a bad layer index, std::length_error when the cache has no room.
  void forward_layer(int l, const DecoderLayer& L, float* x, int64_t n, KVCache& cache, Workspace& ws,
                     ActivationObserver* observer = nullptr) const;
  /// Causal grouped-query attention (the generic path of every layer): n new queries q [n,
  /// n_heads·head_dim] at cache positions p0 … p0+n−1 over FP32 rows keys/values [p0+n,
  /// n_kv_heads·head_dim] (keys rotated at their cache positions) → out [n, n_heads·head_dim];
  /// softmax(s·q·Kᵀ + B)·V per head with sgemm (Vaswani et al. 2017, Eq. 1), s = the spec's
  /// attention scale (1/√d by default), B the ALiBi bias −slope_h·(i − j) of cache positions (ALiBi
  /// models), and query i seeing keys j ∈ (i − window, i] where `window` > 0 (sliding-window
  /// layers), every j ≤ i otherwise; under ws.eviction (block streaming) the visible rows and the
  /// sinks' scores follow BlockEviction (the sinks are scored with ws.q_sink, [n, n_heads·head_dim],
  /// for RoPE models, with q otherwise). Only the keys some query of a block sees are multiplied.
  /// Public so that benchmarks can time it against the fused nuq decode kernel.
  void attention(const float* q, const float* keys, const float* values, int64_t n, int64_t p0, float* out,
                 Workspace& ws, int window = 0) const;
  /// logits [rows, vocab] row-major of the final hidden states x [rows, dim] (the output of the last
  /// layer): the final norm (with its bias where the spec has one), then the LM head, as forward()
  /// ends. For callers that run the layers themselves (forward_layer), e.g. the converter's
  /// per-linear sensitivity (calib/mixed_precision.h). x is left unchanged.
  void project(const float* x, int64_t rows, float* logits) const;
  /// Mutable access for converters that rebuild layers (e.g. replacing DenseLinear by a quantized Linear).
  std::vector<DecoderLayer>& mutable_layers() { return layers_; }
  void set_lm_head(std::unique_ptr<Linear> head) { lm_head_ = std::move(head); }
  std::unique_ptr<Linear> release_lm_head() { return std::move(lm_head_); }

 private:
  void prepare(Workspace& ws, int64_t n, int64_t p0) const;
  /// forward()'s body: runs the n tokens and writes the logits of rows first … n−1 (none when first == n).
  void run_and_project(const int32_t* tokens, int64_t n, int64_t first, KVCache& cache, Workspace& ws, float* logits,
                       ActivationObserver* obs) const;
  /// project() with the caller's scratch xn [rows, dim] for the normed rows.
  void project_with(const float* x, int64_t rows, float* xn, float* logits) const;
  /// Rows [row, row + n) of a layer's input that continue `cache` from position p0.
  struct LayerBlock {
    int64_t row, n;
    KVCache* cache;
    int64_t p0;
  };
  /// One layer on x [n, dim] (the rows of every block, blocks in order; positions in ws.positions):
  /// run_decoder_layer (model/decoder_layer_flow.h) over the CPU backend.
  void run_layer(int l, const DecoderLayer& L, float* x, int64_t n, const LayerBlock* blocks, size_t n_blocks, Workspace& ws,
                 ActivationObserver* obs) const;
  /// The attention step of layer l on ws.q/k/v [n rows of every block] → ws.att: RoPE of q (and of
  /// k for post-RoPE caches) at the rows' positions, each block's rows written to its cache, then
  /// attention over the cache (the fused nuq decode kernel for plain decode steps, attention()
  /// otherwise), with block streaming per ws.eviction.
  void attend_blocks(int l, int64_t n, const LayerBlock* blocks, size_t n_blocks, Workspace& ws) const;
  friend struct CpuLayerBackend;

  ModelConfig config_;
  std::vector<std::vector<float>> rope_inv_freq_;  ///< [n_layers][rope_dim/2] rope_inv_freq(config_, l)
  std::vector<float> alibi_slopes_;                ///< [n_heads] (ALiBi models)
  int64_t key_rotation_ = 0;                       ///< set_key_rotation's block (0: none)
  DecoderGlobals globals_;
  Tensor embed_;
  QuantizedEmbedding embed_q_;  ///< when quantized (owned or borrowed from a mapped .sqm); embed_ is then empty
  std::vector<DecoderLayer> layers_;
  Tensor final_norm_;
  std::unique_ptr<Linear> lm_head_;
};

}  // namespace sq
