#include "formats/rotation_header.h"

#include "core/error.h"

namespace sq {

namespace {

bool known_site(const std::string& s) { return s == "attn_input" || s == "attn_output" || s == "ffn_input" || s == "ffn_hidden"; }

std::map<std::string, int64_t> read_sites(const nlohmann::json& r, const char* key, const std::string& path) {
  std::map<std::string, int64_t> out;
  if (!r.contains(key)) return out;
  const std::string where = path + ": header quantization.rotation." + key;
  if (!r.at(key).is_object()) throw InputError(where + " is not an object");
  for (const auto& [site, v] : r.at(key).items()) {
    if (!known_site(site)) throw InputError(where + " names site '" + site + "', expected attn_input, attn_output, ffn_input or ffn_hidden");
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || (v.get<int64_t>() & (v.get<int64_t>() - 1)) != 0)
      throw InputError(where + "." + site + " is " + v.dump() + ", expected a positive power of two (the Hadamard block)");
    out[site] = v.get<int64_t>();
  }
  return out;
}

}  // namespace

RotationHeader rotation_from_quantization(const nlohmann::json& quant, const std::string& path) {
  RotationHeader h;
  if (!quant.is_object() || !quant.contains("rotation") || quant.at("rotation").is_null()) return h;
  const nlohmann::json& r = quant.at("rotation");
  if (!r.is_object()) throw InputError(path + ": header quantization.rotation is not an object");
  h.method = r.value("method", std::string());
  if (h.method != "hadamard")
    throw InputError(path + ": header quantization.rotation.method is '" + h.method + "', expected 'hadamard'");
  h.online = read_sites(r, "online", path);
  h.offline = read_sites(r, "offline", path);
  if (r.contains("kv_keys")) {
    const nlohmann::json& v = r.at("kv_keys");
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || (v.get<int64_t>() & (v.get<int64_t>() - 1)) != 0)
      throw InputError(path + ": header quantization.rotation.kv_keys is " + v.dump() + ", expected a positive power of two (the Hadamard block)");
    h.kv_keys = v.get<int64_t>();
  }
  return h;
}

void refuse_online_rotation(const nlohmann::json& quant, const std::string& path, const std::string& format) {
  const RotationHeader h = rotation_from_quantization(quant, path);
  if (h.online.empty()) return;
  throw UnsupportedError(path + ": the model rotates the " + h.online.begin()->first + " activation online (sq-convert --rotate " +
                         h.method + ": a Hadamard transform the runner applies before the linear) and " + format +
                         " has no such operation: no " + format + " export (convert with --rotate none; --format compressed-tensors expresses it for w8a8)");
}

}  // namespace sq
