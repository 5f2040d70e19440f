// The Hugging Face architectures sqkit reads, one file each (formats/hf_architecture.h explains
// the interface; registry.cpp lists them). Each function returns its architecture's description.
#pragma once

#include "formats/hf_architecture.h"

namespace sq::hf {

HfArchitecture llama_architecture();      ///< llama.cpp: LlamaForCausalLM
HfArchitecture mistral_architecture();    ///< mistral.cpp: MistralForCausalLM
HfArchitecture qwen2_architecture();      ///< qwen2.cpp: Qwen2ForCausalLM
HfArchitecture mixtral_architecture();    ///< mixtral.cpp: MixtralForCausalLM
HfArchitecture phi3_architecture();       ///< phi3.cpp: Phi3ForCausalLM
HfArchitecture gemma3_architecture();     ///< gemma3.cpp: Gemma3ForCausalLM
HfArchitecture opt_architecture();        ///< opt.cpp: OPTForCausalLM
HfArchitecture gpt_neox_architecture();   ///< gpt_neox.cpp: GPTNeoXForCausalLM
HfArchitecture falcon_architecture();     ///< falcon.cpp: FalconForCausalLM
HfArchitecture gpt2_architecture();       ///< gpt2.cpp: GPT2LMHeadModel
HfArchitecture bloom_architecture();      ///< bloom.cpp: BloomForCausalLM
HfArchitecture mpt_architecture();        ///< mpt.cpp: MptForCausalLM

}  // namespace sq::hf
