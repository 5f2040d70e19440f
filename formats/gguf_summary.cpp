// GGUF summary for sq-inspect (formats/gguf_summary.h).
#include "formats/gguf_summary.h"

#include <map>
#include <string>

namespace sq {
namespace {

bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

/// A metadata value as JSON: scalars as themselves, arrays as "[<element type> x <count>]".
nlohmann::json value_json(const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::BOOL:
      return v.integer != 0;
    case GgufValueType::F32:
    case GgufValueType::F64:
      return v.real;
    case GgufValueType::STRING:
      return v.str;
    case GgufValueType::ARRAY:
      return "[" + gguf_value_type_name(static_cast<uint32_t>(v.elem_type)) + " x " + std::to_string(v.count) + "]";
    case GgufValueType::I8:
    case GgufValueType::I16:
    case GgufValueType::I32:
    case GgufValueType::I64:
      return static_cast<int64_t>(v.integer);
    default:
      return v.integer;  // unsigned integers
  }
}

}  // namespace

nlohmann::json gguf_summary(const GgufFile& file, bool with_tensors) {
  nlohmann::json j;
  j["format"] = "gguf";
  j["gguf_version"] = file.version();
  j["alignment"] = file.alignment();
  j["file_bytes"] = file.mapping()->size();
  j["architecture"] = file.has("general.architecture") ? nlohmann::json(file.get_string("general.architecture")) : nullptr;
  j["name"] = file.has("general.name") ? nlohmann::json(file.get_string("general.name")) : nullptr;
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [key, value] : file.metadata()) meta[key] = value_json(value);
  j["metadata"] = meta;

  if (file.has("tokenizer.ggml.model")) {
    nlohmann::json t;
    t["model"] = file.get_string("tokenizer.ggml.model");
    if (file.has("tokenizer.ggml.pre")) t["pre"] = value_json(file.value("tokenizer.ggml.pre"));
    if (file.has("tokenizer.ggml.tokens")) t["vocab_size"] = file.value("tokenizer.ggml.tokens").count;
    if (file.has("tokenizer.ggml.merges")) t["merges"] = file.value("tokenizer.ggml.merges").count;
    for (const char* k : {"add_bos_token", "bos_token_id", "eos_token_id"})
      if (file.has(std::string("tokenizer.ggml.") + k)) t[k] = value_json(file.value(std::string("tokenizer.ggml.") + k));
    j["tokenizer"] = t;
  } else {
    j["tokenizer"] = nullptr;
  }

  struct Totals {
    int64_t tensors = 0;
    uint64_t bytes = 0;
    int64_t elements = 0;
  };
  std::map<std::string, Totals> by_type;
  uint64_t tensor_bytes = 0;
  int64_t weight_elements = 0;
  nlohmann::json list = nlohmann::json::array();
  for (const GgufTensorInfo& t : file.tensors()) {
    Totals& s = by_type[ggml_type_name(static_cast<uint32_t>(t.type))];
    s.tensors += 1;
    s.bytes += t.nbytes;
    s.elements += t.numel;
    tensor_bytes += t.nbytes;
    if (ends_with(t.name, ".weight")) weight_elements += t.numel;
    if (with_tensors)
      list.push_back({{"name", t.name},
                      {"type", ggml_type_name(static_cast<uint32_t>(t.type))},
                      {"shape", t.shape()},
                      {"offset", t.offset},
                      {"bytes", t.nbytes}});
  }
  j["tensor_count"] = file.tensors().size();
  nlohmann::json bt = nlohmann::json::object();
  for (const auto& [name, s] : by_type) bt[name] = {{"tensors", s.tensors}, {"bytes", s.bytes}, {"elements", s.elements}};
  j["bytes_by_type"] = bt;
  j["tensor_bytes"] = tensor_bytes;
  j["weight_elements"] = weight_elements;
  j["bits_per_weight"] = weight_elements > 0 ? nlohmann::json(8.0 * double(tensor_bytes) / double(weight_elements)) : nullptr;
  if (with_tensors) j["tensors"] = list;
  return j;
}

}  // namespace sq
