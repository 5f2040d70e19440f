// Hugging Face `config.json` <-> sq::ModelConfig for LLaMA-family decoders.
//
// Reference: transformers' LlamaConfig, MistralConfig and Qwen2Config (configuration_*.py); the
// defaults below are theirs.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/model_config.h"

namespace sq {

/// Builds a ModelConfig from a parsed HF config object; `source` (the file path) prefixes every
/// error message.
///
/// Architecture: `architectures[0]` must be LlamaForCausalLM, MistralForCausalLM or
/// Qwen2ForCausalLM (-> architecture "llama", "mistral", "qwen2"); when `architectures` is absent,
/// `model_type` ("llama" / "mistral" / "qwen2") is used instead. Anything else: UnsupportedError
/// ("PATH: architectures[0] = 'GPT2LMHeadModel' is not supported (expected ...)").
///
/// Keys (missing / null -> default):
///   hidden_size, intermediate_size, num_hidden_layers, num_attention_heads   required (InputError)
///   num_key_value_heads       num_attention_heads
///   head_dim                  hidden_size / num_attention_heads (must divide exactly)
///   vocab_size                32000 (llama, mistral), 151936 (qwen2)
///   max_position_embeddings   2048 (llama), 131072 (mistral), 32768 (qwen2)
///   rms_norm_eps              1e-6 (all three)
///   rope_theta, rope_parameters, rope_scaling, partial_rotary_factor
///                             θ (default 10000) and RoPE scaling (default / linear / llama3),
///                             see parse_hf_rope in formats/hf_rope_config.h; other rope types
///                             (dynamic, yarn, longrope, ...) are refused by name
///   tie_word_embeddings       false (all three)
///   bos_token_id / eos_token_id  1 / 2 (a list takes its first element)
///   hidden_act                must be "silu"
///   sliding_window (mistral)  must be null or >= max_position_embeddings: a window that covers
///                             the whole trained context never masks anything, so the model is
///                             plain causal attention (Mistral-7B-v0.1's 4096 < 32768 is rejected)
///   use_sliding_window (qwen2) must be false (sliding_window is then ignored, as in HF)
///   attention_bias (llama)    true -> qkv_bias (HF then also has an o_proj bias, which the
///                             checkpoint loader accepts only when it is all zeros)
///   mlp_bias (llama)          must be false
/// Qwen2 always has q/k/v biases (qkv_bias = true). rope_layout is HalfSplit (HF checkpoints store
/// q/k rows permuted for `rotate_half`). The result is validated with ModelConfig::validate(source).
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

/// The HF `config.json` object describing `config` (architectures, model_type and the keys above,
/// RoPE as top-level rope_theta + legacy rope_scaling — null for plain RoPE, else {"rope_type":
/// "linear" | "llama3", "factor", and for llama3 low_freq_factor, high_freq_factor,
/// original_max_position_embeddings}, which transformers 4 and 5 both read — hidden_act "silu", `torch_dtype` as given, e.g. "float32" / "bfloat16").
/// Floats are written with the shortest decimal that round-trips through float (1e-05, not
/// 9.99999974e-06). Throws UnsupportedError for an architecture other than llama / mistral / qwen2,
/// or for a mistral config with qkv_bias (not expressible in MistralConfig). The config's
/// rope_layout is not written: HF checkpoints are always half-split (see save_hf_checkpoint).
nlohmann::ordered_json make_hf_config_json(const ModelConfig& config, const std::string& torch_dtype);

}  // namespace sq
