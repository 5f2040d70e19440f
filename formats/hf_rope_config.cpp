#include "formats/hf_rope_config.h"

#include <climits>
#include <cstdio>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "core/error.h"
#include "formats/json_limits.h"

namespace sq {

namespace {

/// One JSON object of RoPE keys; `prefix` ("rope_parameters.", "rope_scaling." or "") names its
/// keys in messages.
class RopeKeys {
 public:
  RopeKeys(const nlohmann::json& j, std::string prefix, const std::string& source)
      : j_(j), prefix_(std::move(prefix)), source_(source) {}

  bool present(const char* key) const {
    auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }
  std::string name(const std::string& key) const { return prefix_ + key; }

  /// A finite number within float's range; nullopt when absent or null.
  std::optional<float> number(const char* key) const {
    if (!present(key)) return std::nullopt;
    const nlohmann::json& v = j_.at(key);
    if (!v.is_number())
      throw InputError(source_ + ": key '" + name(key) + "' must be a number, got " + json_excerpt(v));
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::fabs(d) > double(std::numeric_limits<float>::max()))
      throw InputError(source_ + ": key '" + name(key) + "' = " + json_excerpt(v) + " is out of range for a 32-bit float");
    return float(d);
  }
  float required_number(const char* key, const std::string& type) const {
    const auto v = number(key);
    if (!v) throw InputError(source_ + ": required key '" + name(key) + "' is missing (rope_type '" + type + "' needs it)");
    return *v;
  }
  int required_int(const char* key, const std::string& type) const {
    if (!present(key))
      throw InputError(source_ + ": required key '" + name(key) + "' is missing (rope_type '" + type + "' needs it)");
    const nlohmann::json& v = j_.at(key);
    if (!v.is_number_integer() && !v.is_number_unsigned())
      throw InputError(source_ + ": key '" + name(key) + "' must be an integer, got " + json_excerpt(v));
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(INT_MAX)
                               : (v.get<int64_t>() > INT_MAX || v.get<int64_t>() < INT_MIN))
      throw InputError(source_ + ": key '" + name(key) + "' = " + json_excerpt(v) + " is out of range");
    return int(v.get<int64_t>());
  }
  std::optional<std::string> string(const char* key) const {
    if (!present(key)) return std::nullopt;
    const nlohmann::json& v = j_.at(key);
    if (!v.is_string()) throw InputError(source_ + ": key '" + name(key) + "' must be a string, got " + json_excerpt(v));
    return v.get<std::string>();
  }

  /// partial_rotary_factor, when present: a number in (0, 1] (InputError otherwise); when
  /// `must_be_one`, anything but 1 is refused by name (UnsupportedError).
  std::optional<double> partial_rotary(const char* key, bool must_be_one) const {
    const auto f = number(key);
    if (!f) return std::nullopt;
    const double v = j_.at(key).get<double>();
    if (must_be_one && v != 1.0)
      throw UnsupportedError(source_ + ": " + name(key) + " = " + json_excerpt(j_.at(key)) +
                             " is not supported (expected 1: partial rotary embedding is not implemented)");
    if (!(v > 0.0 && v <= 1.0))
      throw InputError(source_ + ": key '" + name(key) + "' = " + json_excerpt(j_.at(key)) + " must be in (0, 1]");
    return v;
  }

  /// Refuses every key of the object outside `allowed` (null values included: transformers would
  /// still see the key).
  void only(const std::set<std::string>& allowed, const std::string& type) const {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (allowed.count(it.key())) continue;
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      throw UnsupportedError(source_ + ": key '" + name(it.key()) + "' is not supported with rope_type '" + type +
                             "' (expected only " + list + ")");
    }
  }

 private:
  const nlohmann::json& j_;
  std::string prefix_;
  const std::string& source_;
};

std::string float_text(float v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", double(v));
  return buf;
}

}  // namespace

HfRopeObject parse_hf_rope_object(const nlohmann::json& obj, const std::string& key, const std::string& source) {
  if (!obj.is_object())
    throw InputError(source + ": key '" + key + "' must be an object or null, got " + json_excerpt(obj));
  const RopeKeys r(obj, key + ".", source);
  const auto rope_type = r.string("rope_type"), legacy_type = r.string("type");
  if (rope_type && legacy_type && *rope_type != *legacy_type)
    throw InputError(source + ": keys '" + key + ".rope_type' ('" + *rope_type + "') and '" + key + ".type' ('" + *legacy_type +
                     "') disagree");
  const std::string type = rope_type ? *rope_type : legacy_type ? *legacy_type : "default";
  const char* type_key = rope_type ? "rope_type" : "type";

  std::set<std::string> allowed = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  HfRopeObject p;
  if (type == "default") {
    // plain RoPE
  } else if (type == "linear") {
    allowed.insert("factor");
    p.scaling.type = RopeScalingType::Linear;
    p.scaling.factor = r.required_number("factor", type);
  } else if (type == "llama3") {
    allowed.insert({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
    p.scaling.type = RopeScalingType::Llama3;
    p.scaling.factor = r.required_number("factor", type);
    p.scaling.low_freq_factor = r.required_number("low_freq_factor", type);
    p.scaling.high_freq_factor = r.required_number("high_freq_factor", type);
    p.scaling.original_max_position_embeddings = r.required_int("original_max_position_embeddings", type);
  } else {
    throw UnsupportedError(source + ": " + key + "." + type_key + " = '" + type +
                           "' is not supported (expected 'default', 'linear' or 'llama3'; RoPE scaling '" + type +
                           "' is not implemented)");
  }
  r.only(allowed, type);
  p.partial_rotary_factor = r.partial_rotary("partial_rotary_factor", false);
  p.theta = r.number("rope_theta");
  return p;
}

HfRope parse_hf_rope(const nlohmann::json& j, const std::string& source, const HfRopeOptions& options) {
  const RopeKeys top(j, "", source);
  const bool must_be_one = !options.partial_rotary;
  std::optional<double> partial = top.partial_rotary("partial_rotary_factor", must_be_one);
  if (!partial && options.legacy_partial_key) partial = top.partial_rotary(options.legacy_partial_key, must_be_one);
  std::optional<float> top_theta = top.number("rope_theta");
  if (options.legacy_theta_key) {
    const std::optional<float> legacy_theta = top.number(options.legacy_theta_key);
    if (legacy_theta && top_theta && *legacy_theta != *top_theta)
      throw InputError(source + ": key '" + options.legacy_theta_key + "' = " + float_text(*legacy_theta) +
                       " disagrees with 'rope_theta' = " + float_text(*top_theta));
    if (!top_theta) top_theta = legacy_theta;
  }

  std::optional<HfRopeObject> params, legacy;
  if (top.present("rope_parameters")) params = parse_hf_rope_object(j.at("rope_parameters"), "rope_parameters", source);
  if (top.present("rope_scaling")) legacy = parse_hf_rope_object(j.at("rope_scaling"), "rope_scaling", source);
  // A factor inside the objects wins over the top-level one (transformers' setdefault).
  for (const auto* o : {&legacy, &params}) {
    if (!*o || !(*o)->partial_rotary_factor) continue;
    const std::string key = o == &params ? "rope_parameters" : "rope_scaling";
    if (must_be_one && *(*o)->partial_rotary_factor != 1.0)
      RopeKeys(j.at(key), key + ".", source).partial_rotary("partial_rotary_factor", true);  // throws, naming it
    partial = (*o)->partial_rotary_factor;
  }
  if (params && legacy && !(params->scaling == legacy->scaling && (!params->theta || !legacy->theta || *params->theta == *legacy->theta)))
    throw InputError(source + ": keys 'rope_parameters' (" + json_excerpt(j.at("rope_parameters")) + ") and 'rope_scaling' (" +
                     json_excerpt(j.at("rope_scaling")) + ") describe different RoPE (give one of them)");
  const std::optional<HfRopeObject>& chosen = params ? params : legacy;

  HfRope out;
  out.theta = options.default_theta;
  out.partial_rotary_factor = partial ? *partial : options.default_partial_rotary;
  if (chosen) out.scaling = chosen->scaling;
  // θ inside the object (params and legacy agree when both give one), else top-level.
  const bool in_params = params && params->theta;
  const std::optional<float> inner = in_params ? params->theta : legacy ? legacy->theta : std::nullopt;
  if (inner && top_theta && *inner != *top_theta)
    throw InputError(source + ": key '" + (in_params ? "rope_parameters" : "rope_scaling") + ".rope_theta' = " +
                     float_text(*inner) + " disagrees with 'rope_theta' = " + float_text(*top_theta));
  const std::optional<float> theta = inner ? inner : top_theta;
  if (theta) out.theta = *theta;
  return out;
}

}  // namespace sq
