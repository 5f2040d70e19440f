#include "formats/config_tensor_check.h"

#include <set>

#include "core/checkpoint.h"
#include "core/error.h"
#include "core/tensor.h"

namespace sq {

int64_t numbered_name_index(const std::string& name, const std::string& prefix, std::string* rest) {
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  size_t k = prefix.size();
  int64_t v = 0;
  int digits = 0;
  while (k < name.size() && name[k] >= '0' && name[k] <= '9' && digits < 10) {
    v = v * 10 + (name[k] - '0');
    ++k;
    ++digits;
  }
  if (digits == 0 || digits > 9 || k >= name.size() || name[k] != '.') return -1;
  if (rest) *rest = name.substr(k + 1);
  return v;
}

void check_layer_count(int n_layers, const std::vector<std::string>& tensor_names, const std::string& config_source,
                       const char* key, const std::string& prefix) {
  std::set<int64_t> layers;
  for (const auto& n : tensor_names) {
    const int64_t i = numbered_name_index(n, prefix);
    if (i >= 0) layers.insert(i);
  }
  if (int64_t(n_layers) <= int64_t(layers.size())) return;
  const std::string held =
      layers.empty() ? "no " + prefix + "* tensors"
                     : std::to_string(layers.size()) + " layer" + (layers.size() == 1 ? "" : "s") + " (" + prefix +
                           std::to_string(*layers.begin()) +
                           (layers.size() == 1 ? "" : " … " + prefix + std::to_string(*layers.rbegin())) + ")";
  throw InputError(config_source + ": " + key + " = " + std::to_string(n_layers) + ", but the checkpoint's tensors hold " +
                   held);
}

void check_config_against_tensors(const ModelConfig& c, const std::vector<std::string>& tensor_names,
                                  const std::function<const std::vector<int64_t>*(const std::string&)>& shape_of,
                                  const std::string& config_source, const ConfigKeyNames& keys) {
  check_layer_count(c.n_layers, tensor_names, config_source, keys.n_layers, keys.layer_prefix);
  const int64_t q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim;
  const std::string hd = std::to_string(c.head_dim), d = keys.dim, l0 = names::layer(0);
  // One check: dimension `axis` of `tensor` must be `expected`, which config key `key` set to `value`.
  struct Dim {
    std::string tensor;
    size_t axis;
    int64_t expected;
    std::string key, value, layout;  ///< layout: the expected shape in config terms
  };
  // Appending (rather than chaining operator+ on temporaries) also sidesteps GCC 12's -Wrestrict
  // false positive on such chains.
  auto layout = [](const std::string& rows, const std::string& cols) {
    std::string t = "[";
    t += rows;
    t += ", ";
    t += cols;
    t += "]";
    return t;
  };
  auto product = [&](int heads, int64_t total) {
    std::string t = std::to_string(heads);
    t += " × ";
    t += hd;
    t += " = ";
    t += std::to_string(total);
    return t;
  };
  const std::string q_key = std::string(keys.n_heads) + " × head_dim", kv_key = std::string(keys.n_kv_heads) + " × head_dim";
  const std::string embed_layout = layout(keys.vocab_size, d), q_layout = layout(q_key, d);
  const Dim dims[] = {
      {names::kEmbed, 1, c.dim, d, std::to_string(c.dim), embed_layout},
      {names::kEmbed, 0, c.vocab_size, keys.vocab_size, std::to_string(c.vocab_size), embed_layout},
      {l0 + "self_attn.q_proj.weight", 1, c.dim, d, std::to_string(c.dim), q_layout},
      {l0 + "self_attn.q_proj.weight", 0, q, q_key, product(c.n_heads, q), q_layout},
      {l0 + "self_attn.k_proj.weight", 0, kv, kv_key, product(c.n_kv_heads, kv), layout(kv_key, d)},
      {l0 + "mlp.gate_proj.weight", 0, c.hidden_dim, keys.hidden_dim, std::to_string(c.hidden_dim), layout(keys.hidden_dim, d)},
  };
  for (const Dim& x : dims) {
    const std::vector<int64_t>* shape = shape_of(x.tensor);
    if (!shape || shape->size() != 2) continue;  // missing / wrong rank: the loader's own checks name it
    if ((*shape)[x.axis] == x.expected) continue;
    std::string msg = config_source;
    msg += ": " + x.key + " = " + x.value;
    msg += ", but tensor '" + x.tensor + "' has shape " + shape_to_string(*shape);
    msg += " (expected " + x.layout + ")";
    throw InputError(msg);
  }
}

}  // namespace sq
