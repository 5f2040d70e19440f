#include "runtime/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "runtime/kv_cache.h"

namespace sq {

GenerationStats generate(const LlamaModel& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                         int64_t context_limit, Sampler& sampler, const std::function<void(int32_t, int32_t)>& on_token,
                         const GenerationOptions& o) {
  const ModelConfig& c = model.config();
  if (prompt.empty()) throw UsageError("the prompt encodes to no tokens");
  if (static_cast<int64_t>(prompt.size()) > context_limit)
    throw UsageError("the prompt has " + std::to_string(prompt.size()) + " tokens, more than the context of " +
                     std::to_string(context_limit));
  if (o.policy.kind == KVPolicyKind::Recompute)
    throw UsageError("--kv-policy recompute is an evaluation baseline (sq-eval), not a generation policy");
  const KVPolicy policy = resolve_kv_policy(o.policy, context_limit);
  const bool evicting = policy.kind != KVPolicyKind::Dense;
  const int64_t capacity = evicting ? policy.capacity(int64_t(1) << 40) : context_limit;
  if (evicting && static_cast<int64_t>(prompt.size()) > capacity)
    throw UsageError("the prompt has " + std::to_string(prompt.size()) + " tokens, more than the " + std::to_string(capacity) +
                     " the KV policy " + kv_policy_name(policy) + " keeps");
  GenerationStats st;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  KVCache cache(c, capacity, o.kv, o.kv_params);
  cache.set_track_quantization_error(policy.kind == KVPolicyKind::QHitter);
  KVRowScores scores;
  Workspace ws;
  if (policy.needs_attention()) ws.attention_mass = &scores.attention;
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));

  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  model.forward(prompt.data(), static_cast<int64_t>(prompt.size()), cache, ws, logits.data(), LogitsFor::LastToken);
  st.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  st.peak_kv_bytes = cache.bytes().total();
  st.peak_kv_tokens = cache.length();

  t0 = clock::now();
  int32_t prev = prompt.back();
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const int32_t next = sampler.sample(logits.data(), c.vocab_size);
    if (!o.ignore_eos && (next == c.eos_id || next == c.bos_id)) {
      st.hit_end_token = true;
      break;
    }
    on_token(prev, next);
    ++st.generated_tokens;
    prev = next;
    if (i + 1 == max_new_tokens) break;
    if (!evicting && cache.length() >= context_limit) {
      st.hit_context_limit = true;
      break;
    }
    if (evicting) evict_for_next_token(policy, cache, scores);
    model.forward(&next, 1, cache, ws, logits.data(), LogitsFor::LastToken);
    st.peak_kv_bytes = std::max(st.peak_kv_bytes, cache.bytes().total());
    st.peak_kv_tokens = std::max(st.peak_kv_tokens, cache.length());
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return st;
}

}  // namespace sq
