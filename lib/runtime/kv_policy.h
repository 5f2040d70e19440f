// KV-cache eviction policies for streaming decoding (`--kv-policy`).
//
//   dense                      keep every token
//   window:W                   the W most recent tokens (window attention)
//   sink:S,window:W            StreamingLLM (Xiao et al. 2024, §3.2): the first S tokens ("attention
//                              sinks") plus the W most recent; S + W tokens in all
//   recompute:W                sliding window with re-computation: every token's logits come from a
//                              fresh prefill of its W most recent tokens (the quality baseline)
//   recompute:W,stride:K       strided re-computation (the cheap form for long streams): one fresh
//                              prefill of W tokens scores its last K predictions, so each is made
//                              from W − K + 1 … W tokens (1 ≤ K ≤ W; K = 1 is recompute:W)
//   h2o:B,recent:R             H2O (Zhang et al. 2023): B tokens in all, the R most recent always kept,
//                              the rest chosen by accumulated attention score ("heavy hitters")
//   qhitter:B,recent:R,lambda:λ  Q-Hitter (Zhang et al. 2024, Algorithm 1): like h2o but the score is
//                              S = λ·Ŝ_s + (1 − λ)·((1 − Ŝ_qk) + (1 − Ŝ_qv)), Ŝ_s the normalized
//                              accumulated attention and Ŝ_qk, Ŝ_qv the normalized per-token key/value
//                              quantization errors ‖K − Quant(K)‖₂, ‖V − Quant(V)‖₂
//
// Budgets count every token attention sees, including the one being decoded: with window:W each
// decoded token attends to itself and the W − 1 before it. B and R may be given as a percentage
// ("20%") of the stream length (`sq-eval -c`). Positions are cache positions (runtime/kv_cache.h;
// every architecture: docs/protocols.md, "Streaming on every architecture").
//
// One eviction decision is made per token for all layers and heads (the cache keeps one row map):
// H2O and Q-Hitter scores are summed over layers and heads. The papers keep per-head (H2O) or
// per-layer sets; this is a documented simplification (docs/protocols.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model_config.h"

namespace sq {

class KVCache;

enum class KVPolicyKind { Dense, Window, Sink, Recompute, H2O, QHitter };

/// A parsed --kv-policy. Percent budgets are resolved by `resolve`.
struct KVPolicy {
  KVPolicyKind kind = KVPolicyKind::Dense;
  int64_t sinks = 0;   ///< S (Sink)
  int64_t window = 0;  ///< W (Window, Sink, Recompute)
  int64_t stride = 1;  ///< K (Recompute): predictions scored per prefill, 1 ≤ K ≤ W
  int64_t budget = 0;  ///< B (H2O, QHitter)
  int64_t recent = 0;  ///< R (H2O, QHitter)
  double lambda = 0;   ///< λ ∈ [0, 1] (QHitter)
  double budget_percent = -1, recent_percent = -1;  ///< when given as "N%"

  /// Whether accumulated attention scores are needed (H2O, Q-Hitter).
  bool needs_attention() const { return kind == KVPolicyKind::H2O || kind == KVPolicyKind::QHitter; }
  /// Largest number of rows the cache holds (dense: `stream_length`).
  int64_t capacity(int64_t stream_length) const;
};

/// Parses a --kv-policy string (grammar above). Throws UsageError naming the policy and what was
/// expected: unknown policy or key, missing/extra fields, non-positive sizes, S ≥ W, stride K > W, R > B,
/// λ outside [0, 1].
KVPolicy parse_kv_policy(const std::string& text);

/// Replaces percentage budgets by token counts for a stream of `length` tokens (rounded, ≥ 1) and
/// re-validates. Throws UsageError when the result is inconsistent (e.g. R > B).
KVPolicy resolve_kv_policy(KVPolicy policy, int64_t length);

/// The policy as text, e.g. "sink:4,window:252".
std::string kv_policy_name(const KVPolicy& policy);

/// Learned absolute positions (GPT-2, OPT): a token is embedded at the position of the cache row it
/// is written to (its text position until eviction; docs/protocols.md, "Streaming on every
/// architecture"), so a cache of `capacity` rows needs that many rows of the position table.
/// Throws UsageError (one line, naming `policy` and the table size) when the model has
/// PositionKind::Learned and `capacity` > config.max_seq_len; `stream` > 0 is the stream length the
/// capacity was derived from (named in the message when nothing is evicted). Nothing otherwise:
/// RoPE and ALiBi models have no position table.
void check_cache_fits_learned_positions(const ModelConfig& config, const KVPolicy& policy, int64_t capacity, int64_t stream = 0);

/// Accumulated per-row state the score-based policies need, aligned with the cache's rows.
struct KVRowScores {
  std::vector<double> attention;  ///< Σ over decode steps, layers and heads of attention received
};

/// Makes room for one more token: when `cache` holds as many rows as the policy allows, evicts
/// rows so that length() = allowed − 1 (keeping `scores` aligned with the cache rows). Dense and
/// Recompute never evict. Q-Hitter reads the cache's per-row quantization errors.
void evict_for_next_token(const KVPolicy& policy, KVCache& cache, KVRowScores& scores);

}  // namespace sq
