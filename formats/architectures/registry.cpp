// The list of Hugging Face architectures (formats/hf_architecture.h). One line per architecture
// file; the order is the order of the "expected ..." list in error messages.
#include "formats/architectures/architectures.h"

namespace sq {

const std::vector<HfArchitecture>& hf_architectures() {
  static const std::vector<HfArchitecture> list = {
      hf::llama_architecture(),  hf::mistral_architecture(), hf::qwen2_architecture(),    hf::mixtral_architecture(),
      hf::phi3_architecture(),   hf::gemma3_architecture(),  hf::opt_architecture(),      hf::gpt_neox_architecture(),
      hf::falcon_architecture(), hf::gpt2_architecture(),    hf::bloom_architecture(),    hf::mpt_architecture(),
  };
  return list;
}

}  // namespace sq
