#include "runtime/kv_cache.h"

namespace sq {

KVCache::KVCache(const ModelConfig& config, int64_t capacity)
    : capacity_(capacity),
      kv_width_(int64_t(config.n_kv_heads) * config.head_dim),
      k_(static_cast<size_t>(config.n_layers * capacity * kv_width_)),
      v_(static_cast<size_t>(config.n_layers * capacity * kv_width_)) {}

}  // namespace sq
