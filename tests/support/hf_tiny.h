// The 14 tiny transformers checkpoints of ../shared/data/reference/hf-tiny (config.json +
// model.safetensors + reference.safetensors, one folder per architecture), shared by the tests
// that run every architecture.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace sq {
class Decoder;
}

namespace sq::test {

/// Every folder of reference/hf-tiny; HfTinyFolders.* fails when one is missing or unlisted.
inline constexpr const char* kHfTinyCheckpoints[] = {
    "llama-gqa", "llama3-rope-scaled", "llama-linear-rope", "mistral-sliding-window", "qwen2", "mixtral-moe", "opt",
    "gpt-neox",  "falcon",             "phi3",              "gemma3-text",            "gpt2",  "bloom-alibi", "mpt-alibi",
};

/// Absolute path of the checkpoint folder `name`, e.g. hf_tiny("gpt2").
std::string hf_tiny(const std::string& name);

/// The reference input_ids (I32) of hf_tiny(name)/reference.safetensors; throws when not I32.
std::vector<int32_t> hf_tiny_reference_ids(const std::string& name);

/// The names of the folders under reference/hf-tiny.
std::set<std::string> hf_tiny_folders_on_disk();

/// Expects `listed` to be the 14 checkpoints, exactly the folders on disk; with `files`, also that
/// each listed folder holds config.json, model.safetensors and reference.safetensors.
void expect_hf_tiny_listed(const std::set<std::string>& listed, bool files);

/// gtest parameter-name generator: the checkpoint name with '-' -> '_'.
struct HfTinyParamName {
  template <class P>
  std::string operator()(const ::testing::TestParamInfo<P>& info) const {
    std::string s = info.param;
    for (char& ch : s)
      if (ch == '-') ch = '_';
    return s;
  }
};

/// [ids.size(), vocab] logits of `model` for `ids` (row-major FP32): one forward pass over every
/// token from an empty FP32 cache, as transformers' model(ids).logits.
std::vector<float> decoder_logits(const Decoder& model, const std::vector<int32_t>& ids);

}  // namespace sq::test
