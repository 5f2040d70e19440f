#include "runtime/generator.h"

#include <chrono>

#include "core/error.h"

namespace sq {

GenerationStats generate(const LlamaModel& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                         int64_t context_limit, Sampler& sampler, const std::function<void(int32_t, int32_t)>& on_token) {
  const ModelConfig& c = model.config();
  if (prompt.empty()) throw UsageError("the prompt encodes to no tokens");
  if (static_cast<int64_t>(prompt.size()) > context_limit)
    throw UsageError("the prompt has " + std::to_string(prompt.size()) + " tokens, more than the context of " +
                     std::to_string(context_limit));
  GenerationStats st;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  KVCache cache(c, context_limit);
  Workspace ws;
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));

  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  model.forward(prompt.data(), static_cast<int64_t>(prompt.size()), cache, ws, logits.data(), LogitsFor::LastToken);
  st.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();

  t0 = clock::now();
  int32_t prev = prompt.back();
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const int32_t next = sampler.sample(logits.data(), c.vocab_size);
    if (next == c.eos_id || next == c.bos_id) {
      st.hit_end_token = true;
      break;
    }
    on_token(prev, next);
    ++st.generated_tokens;
    prev = next;
    if (i + 1 == max_new_tokens) break;
    if (cache.length() >= context_limit) {
      st.hit_context_limit = true;
      break;
    }
    model.forward(&next, 1, cache, ws, logits.data(), LogitsFor::LastToken);
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return st;
}

}  // namespace sq
