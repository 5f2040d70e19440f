// Hugging Face `config.json` <-> sq::ModelConfig.
//
// Which keys mean what is each architecture's business (formats/architectures/*.cpp, listed by
// formats/hf_architecture.h); this file dispatches and validates.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/model_config.h"

namespace sq {

/// Builds a ModelConfig from a parsed HF config object; `source` (the file path) prefixes every
/// error message.
///
/// Architecture: hf_architecture_for (formats/hf_architecture.h) picks the architecture file
/// from `architectures[0]` (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
/// MixtralForCausalLM, Phi3ForCausalLM, Gemma3ForCausalLM, OPTForCausalLM, GPTNeoXForCausalLM,
/// FalconForCausalLM, GPT2LMHeadModel, BloomForCausalLM, MptForCausalLM), or from `model_type`
/// when `architectures` is absent; anything else: UnsupportedError
/// ("PATH: architectures[0] = 'BertForMaskedLM' is not supported (expected ...)"). Its
/// `configure` reads the keys with transformers' defaults (each file documents its keys: sizes,
/// norms, RoPE through parse_hf_rope in formats/hf_rope_config.h, windows, biases, MLP, experts)
/// and refuses by name what sqkit does not run. rope_layout is HalfSplit (HF checkpoints store q/k
/// rows for `rotate_half`). The result is validated with ModelConfig::validate(source).
///
/// Throws InputError (missing required key, wrong JSON type, invalid sizes) or UnsupportedError
/// (unsupported architecture or feature), each naming `source` and the key.
ModelConfig parse_hf_config(const nlohmann::json& config, const std::string& source);

/// Parses `text` (the contents of a `config.json`) as JSON and then with parse_hf_config; `source`
/// names the file in messages. Throws InputError naming `source` when `text` is not valid JSON, and
/// whatever parse_hf_config throws.
ModelConfig parse_hf_config_text(std::string_view text, const std::string& source);

/// Reads and parses the file `path` (a `config.json`) with parse_hf_config_text. Throws InputError
/// naming the file when it is missing or not valid JSON.
ModelConfig load_hf_config(const std::string& path);

/// The HF `config.json` object describing `config`, from its architecture's `make_config` (every
/// architecture has one: architectures, model_type, the keys parse_hf_config reads; the LLaMA family
/// writes RoPE as top-level rope_theta + legacy rope_scaling — null for plain RoPE, else
/// {"rope_type": "linear" | "llama3", "factor", and for llama3 low_freq_factor, high_freq_factor,
/// original_max_position_embeddings}, which transformers 4 and 5 both read — and a Mistral window as
/// sliding_window; the others transformers 5's rope_parameters), plus `torch_dtype` as given, e.g.
/// "float32" / "bfloat16". Floats are written with the shortest decimal that round-trips through
/// float (1e-05, not 9.99999974e-06). Throws UnsupportedError for an architecture sqkit does not
/// know, or for a structure the class cannot express (a mistral config with qkv_bias, an OPT with
/// another LayerNorm epsilon: the non-LLaMA files parse their config back and compare). The config's
/// rope_layout is not written: HF checkpoints are always half-split (see save_hf_checkpoint).
nlohmann::ordered_json make_hf_config_json(const ModelConfig& config, const std::string& torch_dtype);

}  // namespace sq
