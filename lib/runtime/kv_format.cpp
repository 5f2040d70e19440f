#include "runtime/kv_format.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace sq {

const char* kv_key_rope_name(KVKeyRope r) { return r == KVKeyRope::PreRope ? "pre-rope" : "post-rope"; }
const char* kv_key_axis_name(KVKeyAxis a) { return a == KVKeyAxis::PerChannel ? "per-channel" : "per-token"; }

KVSpec parse_kv_spec(const std::string& text, const std::string& option) {
  KVSpec s;
  if (text == "fp32" || text == "f32") return s;
  auto bits_of = [&](const std::string& prefix) -> int {
    if (text.rfind(prefix, 0) != 0 || text.size() != prefix.size() + 1) return 0;
    return text.back() - '0';
  };
  if (const int b = bits_of("int"); b == 8 || b == 4 || b == 3 || b == 2) {
    s.kind = KVKind::Int;
    s.bits = b;
    s.keys = KVKeyRope::PostRope;
    s.key_axis = KVKeyAxis::PerToken;
    return s;
  }
  if (const int b = bits_of("nuq"); b == 4 || b == 3 || b == 2) {
    s.kind = KVKind::Nuq;
    s.bits = b;
    s.keys = KVKeyRope::PreRope;
    s.key_axis = KVKeyAxis::PerChannel;
    s.sink_fp16 = 1;
    return s;
  }
  throw UsageError(option + " '" + text + "': expected fp32, int8, int4, int3, int2, nuq4, nuq3 or nuq2");
}

void apply_kv_options(KVSpec& s, int group, double outliers, bool qnorm, int sink, const std::string& keys,
                      const std::string& key_axis) {
  if (group > 0) {
    if (s.kind != KVKind::Int) throw UsageError("--kv-group applies to the uniform formats int8/int4/int3/int2 only");
    s.group = group;
  } else if (group == 0) {
    throw UsageError("--kv-group must be positive, got 0");
  }
  if (outliers >= 0) {
    if (outliers > 0 && s.kind != KVKind::Nuq) throw UsageError("--kv-outliers applies to the nuq formats only");
    if (!(outliers < 0.5)) throw UsageError("--kv-outliers must be in [0, 0.5), got " + std::to_string(outliers));
    s.outlier_fraction = outliers;
  }
  if (qnorm) {
    if (s.kind != KVKind::Nuq) throw UsageError("--kv-qnorm applies to the nuq formats only");
    s.qnorm = true;
  }
  if (sink >= 0) {
    if (sink > 0 && !s.quantized()) throw UsageError("--kv-sink-fp16 needs a quantized --kv format");
    s.sink_fp16 = sink;
  }
  if (!keys.empty()) {
    if (keys == "pre-rope") s.keys = KVKeyRope::PreRope;
    else if (keys == "post-rope") s.keys = KVKeyRope::PostRope;
    else throw UsageError("--kv-keys '" + keys + "': expected pre-rope or post-rope");
  }
  if (!key_axis.empty()) {
    if (key_axis == "per-channel") s.key_axis = KVKeyAxis::PerChannel;
    else if (key_axis == "per-token") s.key_axis = KVKeyAxis::PerToken;
    else throw UsageError("--kv-key-axis '" + key_axis + "': expected per-channel or per-token");
    if (s.kind != KVKind::Nuq) throw UsageError("--kv-key-axis applies to the nuq formats only");
  }
}

void check_kv_spec(const KVSpec& s, const ModelConfig& c) {
  const int64_t width = int64_t(c.n_kv_heads) * c.head_dim;
  if (s.kind == KVKind::Int) {
    const int64_t g = s.group > 0 ? s.group : c.head_dim;
    if (width % g != 0)
      throw UsageError("--kv-group " + std::to_string(g) + " does not divide the KV width " + std::to_string(width) +
                       " (n_kv_heads " + std::to_string(c.n_kv_heads) + " x head_dim " + std::to_string(c.head_dim) + ")");
  }
  if (width > 65535) throw UsageError("KV width " + std::to_string(width) + " exceeds the 16-bit sparse outlier index");
}

void check_kv_keys_option(const std::string& keys, const ModelConfig& c) {
  if (keys.empty() || c.spec.position == PositionKind::Rope) return;
  throw UsageError("--kv-keys " + keys + ": model '" + c.architecture + "' has no rotary embedding (" +
                   (c.spec.position == PositionKind::Alibi ? "ALiBi" : "learned absolute positions") +
                   "), so its keys are never rotated and pre-rope and post-rope store the same keys; leave --kv-keys out");
}

std::string kv_spec_name(const KVSpec& s) {
  std::string name;
  switch (s.kind) {
    case KVKind::F32: return s.keys == KVKeyRope::PreRope ? "fp32,pre-rope" : "fp32";
    case KVKind::Int:
      name = "int" + std::to_string(s.bits);
      if (s.group > 0) name += "-g" + std::to_string(s.group);
      if (s.keys == KVKeyRope::PreRope) name += ",pre-rope";
      break;
    case KVKind::Nuq: {
      name = "nuq" + std::to_string(s.bits);
      if (s.outlier_fraction > 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "-%g%%", s.outlier_fraction * 100.0);
        name += buf;
      }
      if (s.qnorm) name += "-qnorm";
      if (s.keys == KVKeyRope::PostRope) name += ",post-rope";
      if (s.key_axis == KVKeyAxis::PerToken) name += ",per-token";
      break;
    }
  }
  if (s.sink_fp16 > 0) name += ",sink16:" + std::to_string(s.sink_fp16);
  return name;
}

int64_t kv_row_bytes(const KVSpec& s, int64_t width, int64_t head_dim, bool is_value) {
  switch (s.kind) {
    case KVKind::F32: return 4 * width;
    case KVKind::Int: {
      const int64_t g = s.group > 0 ? s.group : head_dim;
      return (width * s.bits + 7) / 8 + 4 * (width / g);
    }
    case KVKind::Nuq: {
      const bool per_token = is_value || s.key_axis == KVKeyAxis::PerToken;
      return (width * s.bits + 7) / 8 + (per_token ? 4 : 0);
    }
  }
  return 0;
}

nlohmann::json kv_spec_to_json(const KVSpec& s) {
  const char* kind = s.kind == KVKind::F32 ? "fp32" : s.kind == KVKind::Int ? "int" : "nuq";
  return {{"format", s.kind == KVKind::F32 ? std::string("fp32") : kind + std::to_string(s.bits)},
          {"bits", s.bits},
          {"group", s.group},
          {"keys", kv_key_rope_name(s.keys)},
          {"key_axis", kv_key_axis_name(s.key_axis)},
          {"outlier_fraction", s.outlier_fraction},
          {"qnorm", s.qnorm},
          {"sink_fp16", s.sink_fp16}};
}

KVSpec kv_spec_from_json(const nlohmann::json& j, const std::string& source) {
  auto field = [&](const char* name) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(name)) throw InputError(source + ": header kv_cache has no '" + name + "' field");
    return j.at(name);
  };
  auto str = [&](const char* name) {
    const nlohmann::json& v = field(name);
    if (!v.is_string()) throw InputError(source + ": header kv_cache." + name + " must be a string");
    return v.get<std::string>();
  };
  auto integer = [&](const char* name) {
    const nlohmann::json& v = field(name);
    if (!v.is_number_integer()) throw InputError(source + ": header kv_cache." + name + " must be an integer");
    return v.get<int64_t>();
  };
  KVSpec s;
  try {
    s = parse_kv_spec(str("format"), "header kv_cache.format");
  } catch (const UsageError& e) {
    throw InputError(source + ": " + e.what());
  }
  if (integer("bits") != s.bits) throw InputError(source + ": header kv_cache.bits disagrees with its format");
  const int64_t group = integer("group");
  if (group < 0 || group > 65535) throw InputError(source + ": header kv_cache.group must be in [0, 65535]");
  s.group = static_cast<int>(group);
  const std::string keys = str("keys"), axis = str("key_axis");
  if (keys != "pre-rope" && keys != "post-rope") throw InputError(source + ": header kv_cache.keys must be pre-rope or post-rope");
  if (axis != "per-channel" && axis != "per-token") throw InputError(source + ": header kv_cache.key_axis must be per-channel or per-token");
  s.keys = keys == "pre-rope" ? KVKeyRope::PreRope : KVKeyRope::PostRope;
  s.key_axis = axis == "per-channel" ? KVKeyAxis::PerChannel : KVKeyAxis::PerToken;
  const nlohmann::json& of = field("outlier_fraction");
  if (!of.is_number() || !(of.get<double>() >= 0 && of.get<double>() < 0.5))
    throw InputError(source + ": header kv_cache.outlier_fraction must be a number in [0, 0.5)");
  s.outlier_fraction = of.get<double>();
  const nlohmann::json& qn = field("qnorm");
  if (!qn.is_boolean()) throw InputError(source + ": header kv_cache.qnorm must be true or false");
  s.qnorm = qn.get<bool>();
  const int64_t sink = integer("sink_fp16");
  if (sink < 0 || sink > (1 << 20)) throw InputError(source + ": header kv_cache.sink_fp16 must be in [0, 2^20]");
  s.sink_fp16 = static_cast<int>(sink);
  if (!s.quantized() && (s.sink_fp16 != 0 || s.outlier_fraction != 0 || s.qnorm))
    throw InputError(source + ": header kv_cache has quantizer options for the fp32 format");
  if (s.kind != KVKind::Nuq && (s.outlier_fraction != 0 || s.qnorm || s.key_axis == KVKeyAxis::PerChannel))
    throw InputError(source + ": header kv_cache has nuq-only options for format " + str("format"));
  return s;
}

}  // namespace sq
