#include "tests/support/hf_tiny.h"

#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "formats/safetensors.h"
#include "model/decoder.h"
#include "runtime/kv_cache.h"
#include "tests/support/test_data.h"

namespace sq::test {

std::string hf_tiny(const std::string& name) { return shared_data("reference/hf-tiny/" + name); }

std::vector<int32_t> hf_tiny_reference_ids(const std::string& name) {
  SafetensorsFile ref(hf_tiny(name) + "/reference.safetensors");
  if (ref.dtype("input_ids") != "I32") throw std::runtime_error(hf_tiny(name) + "/reference.safetensors: input_ids is not I32");
  std::vector<int32_t> ids(static_cast<size_t>(ref.shape("input_ids").at(0)));
  std::memcpy(ids.data(), ref.raw_data("input_ids"), ids.size() * sizeof(int32_t));
  return ids;
}

std::set<std::string> hf_tiny_folders_on_disk() {
  std::set<std::string> on_disk;
  for (const auto& e : std::filesystem::directory_iterator(shared_data("reference/hf-tiny")))
    if (e.is_directory()) on_disk.insert(e.path().filename().string());
  return on_disk;
}

void expect_hf_tiny_listed(const std::set<std::string>& listed, bool files) {
  EXPECT_EQ(listed.size(), 14u);
  if (files)
    for (const auto& name : listed)
      for (const char* file : {"config.json", "model.safetensors", "reference.safetensors"})
        EXPECT_TRUE(std::filesystem::is_regular_file(hf_tiny(name) + "/" + file)) << hf_tiny(name) + "/" + file << " is missing";
  EXPECT_EQ(hf_tiny_folders_on_disk(), listed);
}

std::vector<float> decoder_logits(const Decoder& model, const std::vector<int32_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size());
  KVCache cache(model.config(), n);
  Workspace ws;
  std::vector<float> out(static_cast<size_t>(n * model.config().vocab_size));
  model.forward(ids.data(), n, cache, ws, out.data(), LogitsFor::AllTokens);
  return out;
}

}  // namespace sq::test
