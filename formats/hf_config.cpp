#include "formats/hf_config.h"

#include "core/error.h"
#include "formats/hf_architecture.h"
#include "formats/json_limits.h"
#include "formats/mapped_file.h"

namespace sq {

ModelConfig parse_hf_config(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw InputError(source + ": expected a JSON object, got " + std::string(j.type_name()));
  const HfArchitecture& arch = hf_architecture_for(j, source);
  ModelConfig c;
  c.architecture = arch.name;
  c.rope_layout = RopeLayout::HalfSplit;
  arch.configure(HfConfigReader(j, source), c);
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
  const HfArchitecture* arch = hf_architecture_named(c.architecture);
  if (!arch || !arch->make_config) {
    std::string writable;
    for (const auto& a : hf_architectures())
      if (a.make_config) writable += std::string(writable.empty() ? "" : ", ") + a.name;
    throw UnsupportedError("cannot write a Hugging Face config for architecture '" + c.architecture + "' (expected one of " +
                           writable + ")");
  }
  nlohmann::ordered_json j = arch->make_config(c);
  j["torch_dtype"] = torch_dtype;
  return j;
}

}  // namespace sq
