#include "formats/hf_config.h"

#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "core/error.h"
#include "formats/hf_rope_config.h"
#include "formats/json_limits.h"
#include "formats/mapped_file.h"

namespace sq {

namespace {

struct ArchInfo {
  const char* class_name;
  const char* model_type;
  int default_vocab;
  int default_max_pos;
};

// Defaults from transformers' LlamaConfig, MistralConfig (max_position_embeddings 4096 * 32) and
// Qwen2Config.
constexpr ArchInfo kArchs[] = {
    {"LlamaForCausalLM", "llama", 32000, 2048},
    {"MistralForCausalLM", "mistral", 32000, 4096 * 32},
    {"Qwen2ForCausalLM", "qwen2", 151936, 32768},
};

class Reader {
 public:
  Reader(const nlohmann::json& j, const std::string& source) : j_(j), source_(source) {}

  bool present(const char* key) const {
    auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }

  int integer(const char* key, const int* fallback) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) {
      if (!fallback) throw InputError(source_ + ": required key '" + key + "' is missing");
      return *fallback;
    }
    return as_int(*it, key);
  }
  int integer(const char* key, int fallback) const { return integer(key, &fallback); }

  /// Token ids may be a single integer or a list (first element used).
  int token_id(const char* key, int fallback) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return fallback;
    if (it->is_array()) {
      if (it->empty()) return fallback;
      return as_int((*it)[0], key);
    }
    return as_int(*it, key);
  }

  /// A number stored as float32: must be finite and within float's range (an rms_norm_eps of 1e39
  /// would otherwise become inf, pass "positive" checks and not survive a round trip).
  float number_f32(const char* key, float fallback) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return fallback;
    if (!it->is_number()) throw InputError(source_ + ": key '" + key + "' must be a number, got " + json_excerpt(*it));
    const double v = it->get<double>();
    if (!std::isfinite(v) || std::fabs(v) > double(std::numeric_limits<float>::max()))
      throw InputError(source_ + ": key '" + key + "' = " + json_excerpt(*it) + " is out of range for a 32-bit float");
    return float(v);
  }

  bool boolean(const char* key, bool fallback) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) throw InputError(source_ + ": key '" + key + "' must be true or false, got " + json_excerpt(*it));
    return it->get<bool>();
  }

  std::string string(const char* key, const std::string& fallback) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return fallback;
    if (!it->is_string()) throw InputError(source_ + ": key '" + key + "' must be a string, got " + json_excerpt(*it));
    return it->get<std::string>();
  }

 private:
  int as_int(const nlohmann::json& v, const char* key) const {
    if (!v.is_number_integer() && !v.is_number_unsigned())
      throw InputError(source_ + ": key '" + key + "' must be an integer, got " + json_excerpt(v));
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(INT_MAX)
                               : (v.get<int64_t>() > INT_MAX || v.get<int64_t>() < INT_MIN))
      throw InputError(source_ + ": key '" + key + "' = " + json_excerpt(v) + " is out of range");
    return int(v.get<int64_t>());
  }

  const nlohmann::json& j_;
  const std::string& source_;
};

/// Shortest decimal that parses back to the same float, as a JSON number.
nlohmann::ordered_json float_json(float v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return nlohmann::ordered_json(std::strtod(std::string(buf, res.ptr).c_str(), nullptr));
}

}  // namespace

ModelConfig parse_hf_config(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw InputError(source + ": expected a JSON object, got " + std::string(j.type_name()));
  Reader r(j, source);
  const std::string expected = "expected LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM";

  const ArchInfo* arch = nullptr;
  auto archs = j.find("architectures");
  if (archs != j.end() && !archs->is_null()) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string())
      throw InputError(source + ": key 'architectures' must be a non-empty list of strings, got " + json_excerpt(*archs));
    const std::string name = (*archs)[0].get<std::string>();
    for (const auto& a : kArchs)
      if (name == a.class_name) arch = &a;
    if (!arch)
      throw UnsupportedError(source + ": architectures[0] = '" + name + "' is not supported (" + expected + ")");
  } else if (r.present("model_type")) {
    const std::string type = r.string("model_type", "");
    for (const auto& a : kArchs)
      if (type == a.model_type) arch = &a;
    if (!arch)
      throw UnsupportedError(source + ": model_type = '" + type + "' is not supported (expected llama, mistral or qwen2)");
  } else {
    throw InputError(source + ": required key 'architectures' is missing (" + expected + ")");
  }
  const std::string type = arch->model_type;

  ModelConfig c;
  c.architecture = type;
  c.dim = r.integer("hidden_size", nullptr);
  c.hidden_dim = r.integer("intermediate_size", nullptr);
  c.n_layers = r.integer("num_hidden_layers", nullptr);
  c.n_heads = r.integer("num_attention_heads", nullptr);
  c.n_kv_heads = r.integer("num_key_value_heads", c.n_heads);
  if (r.present("head_dim")) {
    c.head_dim = r.integer("head_dim", nullptr);
  } else {
    if (c.n_heads > 0 && c.dim % c.n_heads != 0)
      throw InputError(source + ": hidden_size (" + std::to_string(c.dim) + ") is not a multiple of num_attention_heads (" +
                       std::to_string(c.n_heads) + ") and no head_dim is given");
    c.head_dim = c.n_heads > 0 ? c.dim / c.n_heads : 0;
  }
  c.vocab_size = r.integer("vocab_size", arch->default_vocab);
  c.max_seq_len = r.integer("max_position_embeddings", arch->default_max_pos);
  c.norm_eps = r.number_f32("rms_norm_eps", 1e-6f);
  const HfRope rope = parse_hf_rope(j, source);  // rope_parameters / rope_scaling + rope_theta
  c.rope_theta = rope.theta;
  c.rope_scaling = rope.scaling;
  c.tied_embeddings = r.boolean("tie_word_embeddings", false);
  c.bos_id = r.token_id("bos_token_id", 1);
  c.eos_id = r.token_id("eos_token_id", 2);
  c.rope_layout = RopeLayout::HalfSplit;

  const std::string act = r.string("hidden_act", "silu");
  if (act != "silu")
    throw UnsupportedError(source + ": hidden_act = '" + act + "' is not supported (expected 'silu')");

  if (type == "mistral" && r.present("sliding_window")) {
    const int window = r.integer("sliding_window", nullptr);
    if (window < c.max_seq_len)
      throw UnsupportedError(source + ": sliding_window = " + std::to_string(window) +
                             " is not supported (expected null or >= max_position_embeddings = " +
                             std::to_string(c.max_seq_len) + "; sliding-window attention is not implemented)");
  }
  if (type == "qwen2") {
    if (r.boolean("use_sliding_window", false))
      throw UnsupportedError(source + ": use_sliding_window = true is not supported (expected false; "
                                      "sliding-window attention is not implemented)");
    c.qkv_bias = true;
  }
  if (type == "llama") c.qkv_bias = r.boolean("attention_bias", false);
  if (r.boolean("mlp_bias", false))
    throw UnsupportedError(source + ": mlp_bias = true is not supported (expected false)");

  c.validate(source);
  return c;
}

ModelConfig parse_hf_config_text(std::string_view text, const std::string& source) {
  check_json_depth(text, source);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    throw InputError(source + ": not valid JSON: " + e.what());
  }
  return parse_hf_config(j, source);
}

ModelConfig load_hf_config(const std::string& path) {
  return parse_hf_config_text(read_file_to_string(path), path);  // InputError "cannot open PATH: ..."
}

nlohmann::ordered_json make_hf_config_json(const ModelConfig& c, const std::string& torch_dtype) {
  const ArchInfo* arch = nullptr;
  for (const auto& a : kArchs)
    if (c.architecture == a.model_type) arch = &a;
  if (!arch)
    throw UnsupportedError("cannot write a Hugging Face config for architecture '" + c.architecture +
                           "' (expected llama, mistral or qwen2)");
  if (c.architecture == "mistral" && c.qkv_bias)
    throw UnsupportedError("cannot write a Hugging Face Mistral config with q/k/v biases (MistralConfig has none)");

  nlohmann::ordered_json j;
  j["architectures"] = {arch->class_name};
  j["model_type"] = arch->model_type;
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.hidden_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = float_json(c.norm_eps);
  j["rope_theta"] = float_json(c.rope_theta);
  // Legacy rope_scaling (+ top-level rope_theta): read by transformers 4 and 5 alike.
  if (c.rope_scaling.is_default()) {
    j["rope_scaling"] = nullptr;
  } else {
    nlohmann::ordered_json rs;
    rs["rope_type"] = rope_scaling_type_name(c.rope_scaling.type);
    rs["factor"] = float_json(c.rope_scaling.factor);
    if (c.rope_scaling.type == RopeScalingType::Llama3) {
      rs["low_freq_factor"] = float_json(c.rope_scaling.low_freq_factor);
      rs["high_freq_factor"] = float_json(c.rope_scaling.high_freq_factor);
      rs["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    }
    j["rope_scaling"] = std::move(rs);
  }
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["bos_token_id"] = c.bos_id;
  j["eos_token_id"] = c.eos_id;
  if (c.architecture == "llama") {
    j["attention_bias"] = c.qkv_bias;
    j["mlp_bias"] = false;
  }
  if (c.architecture == "mistral") j["sliding_window"] = nullptr;
  if (c.architecture == "qwen2") {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  }
  j["torch_dtype"] = torch_dtype;
  return j;
}

}  // namespace sq
