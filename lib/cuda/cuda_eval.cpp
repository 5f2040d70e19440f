#include "cuda/cuda_eval.h"

#include <string>

#include "core/error.h"

namespace sq {

PerplexityResult evaluate_perplexity_cuda(CudaDecoder& model, const std::vector<int32_t>& tokens,
                                          const PerplexityOptions& o) {
  const ModelConfig& c = model.config();
  if (o.ctx < 2) throw UsageError("context length must be at least 2 tokens, got " + std::to_string(o.ctx));
  CudaKVCache cache(c, o.ctx, o.kv, o.kv_params);
  return evaluate_perplexity_with(c, tokens, o, [&](const int32_t* input, int ctx, float* logits) {
    cache.reset();
    model.forward(input, ctx, cache, logits, LogitsFor::AllTokens);
    return cache.bytes();
  });
}

namespace {

/// The CUDA runner as a generation backend (dense cache).
class CudaGeneration final : public GenerationBackend {
 public:
  CudaGeneration(CudaDecoder& model, int64_t capacity, const GenerationOptions& o)
      : model_(model), cache_(model.config(), capacity, o.kv, o.kv_params) {}
  void forward(const int32_t* tokens, int64_t n, float* logits) override {
    model_.forward(tokens, n, cache_, logits, LogitsFor::LastToken);
  }
  int64_t cache_rows() const override { return cache_.length(); }
  int64_t cache_bytes() const override { return cache_.bytes().total(); }

 private:
  CudaDecoder& model_;
  CudaKVCache cache_;
};

}  // namespace

GenerationStats generate_cuda(CudaDecoder& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                              int64_t context_limit, Sampler& sampler, const std::function<void(int32_t, int32_t)>& on_token,
                              const GenerationOptions& o) {
  const ModelConfig& c = model.config();
  check_generation_prompt(prompt, context_limit);
  if (o.policy.kind != KVPolicyKind::Dense)
    throw UsageError("--kv-policy " + kv_policy_name(o.policy) +
                     ": KV eviction runs on the CPU only; use --device cpu (the CUDA runner keeps a dense cache)");
  const int64_t capacity = dense_generation_capacity(static_cast<int64_t>(prompt.size()), max_new_tokens, context_limit);
  CudaGeneration backend(model, capacity, o);
  GenerationStats st = generate_with(backend, c.vocab_size, c.eos_id, c.bos_id, prompt, max_new_tokens, context_limit, true,
                                     o.ignore_eos, sampler, on_token);
  st.kv_capacity_tokens = capacity;
  return st;
}

}  // namespace sq
