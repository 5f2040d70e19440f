#include "runtime/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/finite.h"
#include "model/nonfinite.h"
#include "runtime/kv_cache.h"

namespace sq {

namespace {

/// The CPU runner: Decoder over a KVCache, with the eviction policy applied before each step.
class CpuGeneration final : public GenerationBackend {
 public:
  CpuGeneration(const Decoder& model, const KVPolicy& policy, int64_t capacity, const GenerationOptions& o)
      : model_(model), policy_(policy), cache_(model.config(), capacity, o.kv, o.kv_params) {
    cache_.set_track_quantization_error(policy.kind == KVPolicyKind::QHitter);
    if (policy.needs_attention()) ws_.attention_mass = &scores_.attention;
  }
  void forward(const int32_t* tokens, int64_t n, float* logits) override {
    model_.forward(tokens, n, cache_, ws_, logits, LogitsFor::LastToken);
  }
  std::string locate_nonfinite(const int32_t* tokens, int64_t n) override {
    return locate_nonfinite_last_block(model_, tokens, n, cache_, ws_);
  }
  void before_decode_step() override {
    if (policy_.kind != KVPolicyKind::Dense) evict_for_next_token(policy_, cache_, scores_);
  }
  int64_t cache_rows() const override { return cache_.length(); }
  int64_t cache_bytes() const override { return cache_.bytes().total(); }

 private:
  const Decoder& model_;
  KVPolicy policy_;
  KVCache cache_;
  KVRowScores scores_;
  Workspace ws_;
};

}  // namespace

void check_generation_prompt(const std::vector<int32_t>& prompt, int64_t context_limit) {
  if (prompt.empty()) throw UsageError("the prompt encodes to no tokens");
  if (static_cast<int64_t>(prompt.size()) > context_limit)
    throw UsageError("the prompt has " + std::to_string(prompt.size()) + " tokens, more than the context of " +
                     std::to_string(context_limit));
}

GenerationStats generate_with(GenerationBackend& backend, int vocab, int32_t eos_id, int32_t bos_id,
                              const std::vector<int32_t>& prompt, int64_t max_new_tokens, int64_t context_limit,
                              bool bounded, bool ignore_eos, Sampler& sampler,
                              const std::function<void(int32_t, int32_t)>& on_token) {
  GenerationStats st;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  std::vector<float> logits(static_cast<size_t>(vocab));

  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  backend.forward(prompt.data(), static_cast<int64_t>(prompt.size()), logits.data());
  if (first_nonfinite_f32(logits.data(), vocab) >= 0)
    throw nonfinite_activation_error(backend.locate_nonfinite(prompt.data(), static_cast<int64_t>(prompt.size())),
                                     "in the prompt (prefill of " + std::to_string(prompt.size()) + " tokens)");
  st.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  st.peak_kv_bytes = backend.cache_bytes();
  st.peak_kv_tokens = backend.cache_rows();

  t0 = clock::now();
  int32_t prev = prompt.back();
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const int32_t next = sampler.sample(logits.data(), vocab);
    if (!ignore_eos && (next == eos_id || next == bos_id)) {
      st.hit_end_token = true;
      break;
    }
    on_token(prev, next);
    ++st.generated_tokens;
    prev = next;
    if (i + 1 == max_new_tokens) break;
    if (bounded && backend.cache_rows() >= context_limit) {
      st.hit_context_limit = true;
      break;
    }
    backend.before_decode_step();
    backend.forward(&next, 1, logits.data());
    if (first_nonfinite_f32(logits.data(), vocab) >= 0)
      throw nonfinite_activation_error(backend.locate_nonfinite(&next, 1),
                                       "at generated token " + std::to_string(i + 1) + " (position " +
                                           std::to_string(st.prompt_tokens + i) + ")");
    st.peak_kv_bytes = std::max(st.peak_kv_bytes, backend.cache_bytes());
    st.peak_kv_tokens = std::max(st.peak_kv_tokens, backend.cache_rows());
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return st;
}

int64_t dense_generation_capacity(int64_t prompt_tokens, int64_t max_new_tokens, int64_t context_limit) {
  return std::min(context_limit, prompt_tokens + std::max<int64_t>(max_new_tokens, 1));
}

GenerationStats generate(const Decoder& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                         int64_t context_limit, Sampler& sampler, const std::function<void(int32_t, int32_t)>& on_token,
                         const GenerationOptions& o) {
  const ModelConfig& c = model.config();
  check_generation_prompt(prompt, context_limit);
  if (o.policy.kind == KVPolicyKind::Recompute)
    throw UsageError("--kv-policy recompute is an evaluation baseline (sq-eval), not a generation policy");
  const KVPolicy policy = resolve_kv_policy(o.policy, context_limit);
  const bool evicting = policy.kind != KVPolicyKind::Dense;
  const int64_t capacity = evicting ? policy.capacity(int64_t(1) << 40)
                                    : dense_generation_capacity(static_cast<int64_t>(prompt.size()), max_new_tokens, context_limit);
  if (evicting && static_cast<int64_t>(prompt.size()) > capacity)
    throw UsageError("the prompt has " + std::to_string(prompt.size()) + " tokens, more than the " + std::to_string(capacity) +
                     " the KV policy " + kv_policy_name(policy) + " keeps");
  if (evicting) check_cache_fits_learned_positions(c, policy, capacity);
  CpuGeneration backend(model, policy, capacity, o);
  GenerationStats st = generate_with(backend, c.vocab_size, c.eos_id, c.bos_id, prompt, max_new_tokens, context_limit, !evicting,
                                     o.ignore_eos, sampler, on_token);
  st.kv_capacity_tokens = capacity;
  return st;
}

}  // namespace sq
