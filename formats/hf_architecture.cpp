#include "formats/hf_architecture.h"

#include <climits>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "formats/json_limits.h"

namespace sq {

// ---- HfConfigReader ------------------------------------------------------------------------------

HfConfigReader::HfConfigReader(const nlohmann::json& j, const std::string& source, std::string prefix)
    : j_(j), source_(source), prefix_(std::move(prefix)) {}

bool HfConfigReader::present(const char* key) const {
  if (!j_.is_object()) return false;
  auto it = j_.find(key);
  return it != j_.end() && !it->is_null();
}

const char* HfConfigReader::pick(std::initializer_list<const char*> keys) const {
  for (const char* k : keys)
    if (present(k)) return k;
  return *keys.begin();
}

int HfConfigReader::as_int(const nlohmann::json& v, const char* key) const {
  if (!v.is_number_integer() && !v.is_number_unsigned())
    throw InputError(source_ + ": key '" + name(key) + "' must be an integer, got " + json_excerpt(v));
  if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(INT_MAX)
                             : (v.get<int64_t>() > INT_MAX || v.get<int64_t>() < INT_MIN))
    throw InputError(source_ + ": key '" + name(key) + "' = " + json_excerpt(v) + " is out of range");
  return int(v.get<int64_t>());
}

int HfConfigReader::integer(const char* key, const int* fallback) const {
  if (!present(key)) {
    if (!fallback) throw InputError(source_ + ": required key '" + name(key) + "' is missing");
    return *fallback;
  }
  return as_int(j_.at(key), key);
}

int HfConfigReader::token_id(const char* key, int fallback) const {
  if (!present(key)) return fallback;
  const nlohmann::json& v = j_.at(key);
  if (v.is_array()) {
    if (v.empty()) return fallback;
    return as_int(v[0], key);
  }
  return as_int(v, key);
}

float HfConfigReader::number_f32(const char* key, float fallback) const {
  if (!present(key)) return fallback;
  const nlohmann::json& v = j_.at(key);
  if (!v.is_number()) throw InputError(source_ + ": key '" + name(key) + "' must be a number, got " + json_excerpt(v));
  // Within float's range: an rms_norm_eps of 1e39 would otherwise become inf, pass "positive"
  // checks and not survive a round trip.
  const double d = v.get<double>();
  if (!std::isfinite(d) || std::fabs(d) > double(std::numeric_limits<float>::max()))
    throw InputError(source_ + ": key '" + name(key) + "' = " + json_excerpt(v) + " is out of range for a 32-bit float");
  return float(d);
}

bool HfConfigReader::boolean(const char* key, bool fallback) const {
  if (!present(key)) return fallback;
  const nlohmann::json& v = j_.at(key);
  if (!v.is_boolean()) throw InputError(source_ + ": key '" + name(key) + "' must be true or false, got " + json_excerpt(v));
  return v.get<bool>();
}

std::string HfConfigReader::string(const char* key, const std::string& fallback) const {
  if (!present(key)) return fallback;
  const nlohmann::json& v = j_.at(key);
  if (!v.is_string()) throw InputError(source_ + ": key '" + name(key) + "' must be a string, got " + json_excerpt(v));
  return v.get<std::string>();
}

HfConfigReader HfConfigReader::object(const char* key) const {
  if (present(key)) {
    const nlohmann::json& v = j_.at(key);
    if (!v.is_object()) throw InputError(source_ + ": key '" + name(key) + "' must be an object, got " + json_excerpt(v));
    return HfConfigReader(v, source_, name(key) + ".");
  }
  auto empty = std::make_shared<nlohmann::json>(nlohmann::json::object());
  HfConfigReader r(*empty, source_, name(key) + ".");
  r.owned_ = std::move(empty);
  return r;
}

void HfConfigReader::refuse(const char* key, const std::string& expected) const {
  const std::string value = present(key) ? json_excerpt(j_.at(key)) : std::string("absent");
  throw UnsupportedError(source_ + ": " + name(key) + " = " + value + " is not supported (expected " + expected + ")");
}

// ---- tensor sources ------------------------------------------------------------------------------

Tensor HfTensorSource::get(const std::string& name, const std::vector<int64_t>& expected_shape) const {
  const std::vector<int64_t>* s = shape(name);
  if (!s)
    throw InputError(source() + ": tensor '" + name + "' is missing (expected shape " + shape_to_string(expected_shape) + ")");
  if (*s != expected_shape)
    throw InputError(file(name) + ": tensor '" + name + "' has shape " + shape_to_string(*s) + ", expected " +
                     shape_to_string(expected_shape) + " from " + config_source());
  return load(name);
}

HfTensorMap::HfTensorMap(std::map<std::string, Tensor> tensors, std::string source)
    : tensors_(std::move(tensors)), source_(std::move(source)), config_source_(source_ + "/config.json") {}

const std::vector<int64_t>* HfTensorMap::shape(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second.shape();
}

// ---- lookup --------------------------------------------------------------------------------------

namespace {

/// "A, B or C".
std::string one_of(const std::vector<std::string>& items) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i == 0 ? "" : i + 1 == items.size() ? " or " : ", ") + items[i];
  return s;
}

}  // namespace

const HfArchitecture& hf_architecture_for(const nlohmann::json& j, const std::string& source) {
  std::vector<std::string> classes, types;
  for (const auto& a : hf_architectures()) {
    classes.insert(classes.end(), a.classes.begin(), a.classes.end());
    types.insert(types.end(), a.model_types.begin(), a.model_types.end());
  }
  const std::string expected = "expected " + one_of(classes);
  auto archs = j.find("architectures");
  if (archs != j.end() && !archs->is_null()) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string())
      throw InputError(source + ": key 'architectures' must be a non-empty list of strings, got " + json_excerpt(*archs));
    const std::string name = (*archs)[0].get<std::string>();
    for (const auto& a : hf_architectures())
      for (const auto& c : a.classes)
        if (c == name) return a;
    throw UnsupportedError(source + ": architectures[0] = '" + name + "' is not supported (" + expected + ")");
  }
  auto type = j.find("model_type");
  if (type != j.end() && !type->is_null()) {
    if (!type->is_string()) throw InputError(source + ": key 'model_type' must be a string, got " + json_excerpt(*type));
    const std::string name = type->get<std::string>();
    for (const auto& a : hf_architectures())
      for (const auto& t : a.model_types)
        if (t == name) return a;
    throw UnsupportedError(source + ": model_type = '" + name + "' is not supported (expected " + one_of(types) + ")");
  }
  throw InputError(source + ": required key 'architectures' is missing (" + expected + ")");
}

const HfArchitecture* hf_architecture_named(const std::string& name) {
  for (const auto& a : hf_architectures())
    if (name == a.name) return &a;
  return nullptr;
}

}  // namespace sq
