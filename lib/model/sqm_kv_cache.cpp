#include "model/sqm_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace sq {

std::string kv_tensor_name(int layer, const char* what) {
  return "model.layers." + std::to_string(layer) + ".kv." + what;
}

namespace {

std::vector<float> read_f32(const SqmFile& f, const std::string& name, int64_t expected, const std::string& why) {
  if (!f.has(name)) throw InputError(f.path() + ": tensor '" + name + "' is missing (" + why + ")");
  const SqmTensorInfo& info = f.info(name);
  if (info.dtype != SqmDType::F32 || info.shape.size() != 1 || info.shape[0] != expected)
    throw InputError(f.path() + ": tensor '" + name + "' must be F32 [" + std::to_string(expected) + "] (" + why + "), got " +
                     std::to_string(info.numel()) + " entries");
  const SqmBytes raw = f.raw(name);
  std::vector<float> v(static_cast<size_t>(expected));
  std::memcpy(v.data(), raw.data, v.size() * sizeof(float));
  for (float x : v)
    if (!std::isfinite(x)) throw InputError(f.path() + ": tensor '" + name + "' holds a non-finite value");
  return v;
}

}  // namespace

KVQuantization kv_quantization_from_sqm(const SqmFile& f, const ModelConfig& c) {
  KVQuantization q;
  const nlohmann::json& h = f.header();
  if (!h.contains("kv_cache")) return q;
  q.spec = kv_spec_from_json(h.at("kv_cache"), f.path());
  try {
    check_kv_spec(q.spec, c);
  } catch (const UsageError& e) {
    throw InputError(f.path() + ": header kv_cache does not fit the model: " + e.what());
  }
  if (q.spec.kind != KVKind::Nuq) return q;
  const int64_t k = int64_t(1) << q.spec.bits, width = int64_t(c.n_kv_heads) * c.head_dim;
  const std::string why = std::to_string(k) + " signposts for nuq" + std::to_string(q.spec.bits);
  q.params.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    NuqLayerParams& p = q.params[static_cast<size_t>(l)];
    p.key_codebook = read_f32(f, kv_tensor_name(l, "key_codebook"), k, why);
    p.value_codebook = read_f32(f, kv_tensor_name(l, "value_codebook"), k, why);
    for (const auto* cb : {&p.key_codebook, &p.value_codebook})
      if (!std::is_sorted(cb->begin(), cb->end()))
        throw InputError(f.path() + ": layer " + std::to_string(l) + " KV codebook is not sorted ascending");
    if (q.spec.key_axis == KVKeyAxis::PerChannel) {
      p.key_offset = read_f32(f, kv_tensor_name(l, "key_offset"), width, "per-channel key offsets");
      p.key_scale = read_f32(f, kv_tensor_name(l, "key_scale"), width, "per-channel key scales");
      for (float s : p.key_scale)
        if (s < 0) throw InputError(f.path() + ": tensor '" + kv_tensor_name(l, "key_scale") + "' has a negative scale");
    }
  }
  return q;
}

KVQuantization select_kv_format(const KVQuantization& file, bool converted, const std::string& kv, int group, int sink,
                                const std::string& keys, const ModelConfig& config) {
  if (kv.empty()) {
    if (group > 0 || sink >= 0 || !keys.empty())
      throw UsageError("--kv-group, --kv-sink-fp16 and --kv-keys need --kv");
    return file;
  }
  KVSpec spec = parse_kv_spec(kv);
  check_kv_keys_option(keys, config);
  if (spec.kind == KVKind::Nuq) {
    if (file.spec.kind != KVKind::Nuq || file.spec.bits != spec.bits)
      throw UsageError("--kv " + kv + " needs the model's KV codebooks: convert it with sq-convert --kv " + kv +
                       (converted ? " (this model was converted for KV format " + kv_spec_name(file.spec) + ")"
                                  : " --calib CALIB.h5 (this model is not a converted .sqm file, so it has none)"));
    if (group > 0 || sink >= 0 || !keys.empty())
      throw UsageError("nuq KV options are fixed at conversion (sq-convert --kv-*); the file has " + kv_spec_name(file.spec));
    return file;
  }
  apply_kv_options(spec, group > 0 ? group : -1, -1, false, sink, keys, "");
  check_kv_spec(spec, config);
  return KVQuantization{spec, {}};
}

}  // namespace sq
