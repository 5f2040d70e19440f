#include "model/sqm_model.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/finite.h"
#include "formats/config_tensor_check.h"
#include "formats/rotation_header.h"
#include "formats/safetensors.h"
#include "formats/tokenizer.h"
#include "model/decoder_linears.h"
#include "model/hadamard_input_linear.h"
#include "model/w4a16_linear.h"
#include "model/w8a16_linear.h"
#include "model/w4a4_linear.h"
#include "model/w8a8_linear.h"
#include "quant/q4k_layout.h"
#include "quant/int8_quantize.h"

namespace sq {

nlohmann::json model_config_to_json(const ModelConfig& c) {
  nlohmann::json j = {{"architecture", c.architecture}, {"dim", c.dim},           {"hidden_dim", c.hidden_dim},
                      {"n_layers", c.n_layers},         {"n_heads", c.n_heads},   {"n_kv_heads", c.n_kv_heads},
                      {"head_dim", c.head_dim},         {"vocab_size", c.vocab_size}, {"max_seq_len", c.max_seq_len},
                      {"norm_eps", c.norm_eps},         {"rope_theta", c.rope_theta}, {"rope_layout", rope_layout_name(c.rope_layout)},
                      {"tied_embeddings", c.tied_embeddings}, {"qkv_bias", c.qkv_bias}, {"bos_id", c.bos_id}, {"eos_id", c.eos_id}};
  // Written only when RoPE is scaled, so plain-RoPE headers are unchanged (files without it are plain RoPE).
  if (!c.rope_scaling.is_default()) {
    nlohmann::json rs = {{"type", rope_scaling_type_name(c.rope_scaling.type)}, {"factor", c.rope_scaling.factor}};
    if (c.rope_scaling.type == RopeScalingType::Llama3) {
      rs["low_freq_factor"] = c.rope_scaling.low_freq_factor;
      rs["high_freq_factor"] = c.rope_scaling.high_freq_factor;
      rs["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    }
    j["rope_scaling"] = std::move(rs);
  }
  // Written only when the layer structure is not LLaMA's, so LLaMA headers are unchanged (files
  // without it have the LLaMA structure).
  if (c.spec != DecoderSpec{}) {
    const DecoderSpec& sp = c.spec;
    j["decoder"] = {{"norm", norm_kind_name(sp.norm)},
                    {"norm_bias", sp.norm_bias},
                    {"post_attn_norm", sp.post_attn_norm},
                    {"post_ffn_norm", sp.post_ffn_norm},
                    {"qk_norm", sp.qk_norm},
                    {"parallel_residual", sp.parallel_residual},
                    {"shared_input_norm", sp.shared_input_norm},
                    {"position", position_kind_name(sp.position)},
                    {"rope_dim", sp.rope_dim},
                    {"learned_position_offset", sp.learned_position_offset},
                    {"attn_scale", sp.attn_scale},
                    {"o_bias", sp.o_bias},
                    {"mlp_gated", sp.mlp_gated},
                    {"activation", activation_name(sp.activation)},
                    {"mlp_bias", sp.mlp_bias},
                    {"n_experts", sp.n_experts},
                    {"experts_per_token", sp.experts_per_token},
                    {"embed_scale", sp.embed_scale},
                    {"embed_norm", sp.embed_norm},
                    {"layer_window", sp.layer_window},
                    {"rope_local_theta", sp.rope_local_theta}};
  }
  return j;
}

namespace {

/// model_config.rope_scaling of a .sqm header (see model_config_to_json); absent or null -> plain RoPE.
RopeScaling rope_scaling_from_json(const nlohmann::json& config, const std::string& source) {
  RopeScaling s;
  auto it = config.find("rope_scaling");
  if (it == config.end() || it->is_null()) return s;
  const nlohmann::json& j = *it;
  if (!j.is_object() || !j.contains("type") || !j.at("type").is_string())
    throw InputError(source + ": model_config.rope_scaling must be an object with a string 'type'");
  const std::string type = j.at("type").get<std::string>();
  std::vector<std::string> keys = {"type", "factor"};
  if (type == "linear") {
    s.type = RopeScalingType::Linear;
  } else if (type == "llama3") {
    s.type = RopeScalingType::Llama3;
    keys.insert(keys.end(), {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  } else {
    throw UnsupportedError(source + ": model_config.rope_scaling.type '" + type +
                           "' is not supported (expected 'linear' or 'llama3'; written by a newer sqkit?)");
  }
  for (const auto& k : keys)
    if (!j.contains(k)) throw InputError(source + ": model_config.rope_scaling has no '" + k + "' (type '" + type + "')");
  for (auto kv = j.begin(); kv != j.end(); ++kv)
    if (std::find(keys.begin(), keys.end(), kv.key()) == keys.end())
      throw UnsupportedError(source + ": model_config.rope_scaling." + kv.key() + " is not supported for type '" + type + "'");
  s.factor = j.at("factor").get<float>();
  if (s.type == RopeScalingType::Llama3) {
    s.low_freq_factor = j.at("low_freq_factor").get<float>();
    s.high_freq_factor = j.at("high_freq_factor").get<float>();
    s.original_max_position_embeddings = j.at("original_max_position_embeddings").get<int>();
  }
  return s;
}

/// model_config.decoder of a .sqm header (see model_config_to_json); absent -> the LLaMA structure.
/// Every field is required (a file written by sqkit has all of them); an unknown field or enum
/// value is an UnsupportedError (a newer sqkit), a missing or mistyped one an InputError.
DecoderSpec decoder_spec_from_json(const nlohmann::json& config, const std::string& source) {
  DecoderSpec sp;
  auto it = config.find("decoder");
  if (it == config.end()) return sp;
  const nlohmann::json& j = *it;
  const std::string where = source + ": model_config.decoder";
  if (!j.is_object()) throw InputError(where + " must be an object");
  const std::vector<std::string> keys = {"norm",         "norm_bias",        "post_attn_norm",          "post_ffn_norm",
                                         "qk_norm",      "parallel_residual", "shared_input_norm",      "position",
                                         "rope_dim",     "learned_position_offset", "attn_scale",       "o_bias",
                                         "mlp_gated",    "activation",       "mlp_bias",                "n_experts",
                                         "experts_per_token", "embed_scale", "embed_norm",              "layer_window",
                                         "rope_local_theta"};
  for (auto kv = j.begin(); kv != j.end(); ++kv)
    if (std::find(keys.begin(), keys.end(), kv.key()) == keys.end())
      throw UnsupportedError(where + "." + kv.key() + " is not a field this sqkit knows (written by a newer sqkit?)");
  auto get = [&](const char* key, auto& out) {
    if (!j.contains(key)) throw InputError(where + " has no '" + key + "'");
    try {
      out = j.at(key).get<std::remove_reference_t<decltype(out)>>();
    } catch (const nlohmann::json::exception&) {
      throw InputError(where + "." + key + " has the wrong type (" + j.at(key).dump() + ")");
    }
  };
  auto choice = [&](const char* key, const std::vector<std::string>& allowed) {
    std::string v;
    get(key, v);
    for (size_t i = 0; i < allowed.size(); ++i)
      if (v == allowed[i]) return static_cast<int>(i);
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "'" : ", '") + a + "'";
    throw UnsupportedError(where + "." + key + " '" + v + "' is not supported (expected " + list + ")");
  };
  sp.norm = choice("norm", {norm_kind_name(NormKind::RMSNorm), norm_kind_name(NormKind::LayerNorm)}) == 0 ? NormKind::RMSNorm
                                                                                                        : NormKind::LayerNorm;
  const PositionKind positions[] = {PositionKind::Rope, PositionKind::Alibi, PositionKind::Learned};
  sp.position = positions[choice("position", {position_kind_name(positions[0]), position_kind_name(positions[1]),
                                              position_kind_name(positions[2])})];
  const Activation acts[] = {Activation::SiLU, Activation::GeluTanh, Activation::Gelu, Activation::ReLU};
  sp.activation = acts[choice("activation", {activation_name(acts[0]), activation_name(acts[1]), activation_name(acts[2]),
                                             activation_name(acts[3])})];
  get("norm_bias", sp.norm_bias);
  get("post_attn_norm", sp.post_attn_norm);
  get("post_ffn_norm", sp.post_ffn_norm);
  get("qk_norm", sp.qk_norm);
  get("parallel_residual", sp.parallel_residual);
  get("shared_input_norm", sp.shared_input_norm);
  get("rope_dim", sp.rope_dim);
  get("learned_position_offset", sp.learned_position_offset);
  get("attn_scale", sp.attn_scale);
  get("o_bias", sp.o_bias);
  get("mlp_gated", sp.mlp_gated);
  get("mlp_bias", sp.mlp_bias);
  get("n_experts", sp.n_experts);
  get("experts_per_token", sp.experts_per_token);
  get("embed_scale", sp.embed_scale);
  get("embed_norm", sp.embed_norm);
  get("layer_window", sp.layer_window);
  get("rope_local_theta", sp.rope_local_theta);
  return sp;
}

}  // namespace

ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw InputError(source + ": header has no 'model_config' object");
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!j.contains(key)) throw InputError(source + ": model_config has no '" + key + "'");
    return j.at(key);
  };
  ModelConfig c;
  try {
    c.architecture = field("architecture").get<std::string>();
    c.dim = field("dim").get<int>();
    c.hidden_dim = field("hidden_dim").get<int>();
    c.n_layers = field("n_layers").get<int>();
    c.n_heads = field("n_heads").get<int>();
    c.n_kv_heads = field("n_kv_heads").get<int>();
    c.head_dim = field("head_dim").get<int>();
    c.vocab_size = field("vocab_size").get<int>();
    c.max_seq_len = field("max_seq_len").get<int>();
    c.norm_eps = field("norm_eps").get<float>();
    c.rope_theta = field("rope_theta").get<float>();
    c.rope_scaling = rope_scaling_from_json(j, source);
    c.spec = decoder_spec_from_json(j, source);
    const std::string layout = field("rope_layout").get<std::string>();
    if (layout == "interleaved") c.rope_layout = RopeLayout::Interleaved;
    else if (layout == "half-split") c.rope_layout = RopeLayout::HalfSplit;
    else throw InputError(source + ": model_config.rope_layout '" + layout + "' is not 'interleaved' or 'half-split'");
    c.tied_embeddings = field("tied_embeddings").get<bool>();
    c.qkv_bias = field("qkv_bias").get<bool>();
    c.bos_id = field("bos_id").get<int>();
    c.eos_id = field("eos_id").get<int>();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(source + ": model_config has a field of the wrong type (" + e.what() + ")");
  }
  c.validate(source);
  return c;
}

namespace {

/// FP32 tensor `name` with the expected shape: zero-copy for uncompressed F32, widened otherwise.
Tensor load_float(const std::shared_ptr<SqmFile>& f, const std::string& name, const std::vector<int64_t>& shape) {
  if (!f->has(name)) throw InputError(f->path() + ": tensor '" + name + "' is missing (expected shape " + shape_to_string(shape) + ")");
  const SqmTensorInfo& info = f->info(name);
  if (info.shape != shape)
    throw InputError(f->path() + ": tensor '" + name + "' has shape " + shape_to_string(info.shape) + ", expected " + shape_to_string(shape));
  const SqmBytes raw = f->raw(name);
  const int64_t n = static_cast<int64_t>(info.numel());
  switch (info.dtype) {
    case SqmDType::F32:
      if (!info.compressed && reinterpret_cast<uintptr_t>(raw.data) % alignof(float) == 0)
        return Tensor::view(shape, reinterpret_cast<const float*>(raw.data), f);
      {
        std::vector<float> v(static_cast<size_t>(n));
        std::memcpy(v.data(), raw.data, raw.size);
        return Tensor::from_vector(shape, std::move(v));
      }
    case SqmDType::F16:
    case SqmDType::BF16: {
      std::vector<float> v(static_cast<size_t>(n));
      const auto* h = reinterpret_cast<const uint16_t*>(raw.data);
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] = info.dtype == SqmDType::F16 ? half_to_float(h[i]) : bf16_to_float(h[i]);
      return Tensor::from_vector(shape, std::move(v));
    }
    default:
      throw InputError(f->path() + ": tensor '" + name + "' has dtype " + sqm_dtype_name(info.dtype) + ", expected F32, F16 or BF16");
  }
}

ActQuant parse_act(const std::string& s, const std::string& source) {
  if (s == "per-token") return ActQuant::PerToken;
  if (s == "per-tensor-dynamic") return ActQuant::PerTensorDynamic;
  if (s == "per-tensor-static") return ActQuant::PerTensorStatic;
  if (s == "per-token-group") return ActQuant::PerTokenGroup;
  throw InputError(source + ": header quantization.act '" + s + "' is not per-token, per-token-group, per-tensor-dynamic or per-tensor-static");
}

/// Raw bytes of tensor `name`, which must have dtype `dtype` and shape `shape`.
SqmBytes checked_raw(const std::shared_ptr<SqmFile>& f, const std::string& name, SqmDType dtype,
                     const std::vector<int64_t>& shape) {
  if (!f->has(name)) throw InputError(f->path() + ": tensor '" + name + "' is missing (expected " + sqm_dtype_name(dtype) + " " +
                                      shape_to_string(shape) + ")");
  const SqmTensorInfo& info = f->info(name);
  if (info.dtype != dtype || info.shape != shape)
    throw InputError(f->path() + ": tensor '" + name + "' is " + sqm_dtype_name(info.dtype) + " " + shape_to_string(info.shape) +
                     ", expected " + sqm_dtype_name(dtype) + " " + shape_to_string(shape));
  return f->raw(name);
}

/// checked_raw's bytes, copied.
std::vector<uint8_t> load_bytes(const std::shared_ptr<SqmFile>& f, const std::string& name, SqmDType dtype,
                                const std::vector<int64_t>& shape) {
  const SqmBytes raw = checked_raw(f, name, dtype, shape);
  return std::vector<uint8_t>(raw.data, raw.data + raw.size);
}

/// Group-wise INT4 weights `base`: weight I4x2/U4x2 [out, in], weight_scale F16 [out, ⌈in/g⌉],
/// weight_zero U4x2 [out, ⌈in/g⌉] (asymmetric), or weight_superblock_scale U8 [out, S, 16] instead of
/// both (K-quant, quant/q4k_layout.h); g from the header's quantization.group_size. The
/// packed codes are borrowed from the mapping. Throws InputError naming the file and tensor.
Int4Weights load_int4_weights(const std::shared_ptr<SqmFile>& f, const std::string& base, int64_t out, int64_t in,
                              const nlohmann::json& quant) {
  Int4Weights w;
  w.out = out;
  w.in = in;
  w.asym = f->info(base + ".weight").dtype == SqmDType::U4x2;
  if (!quant.contains("group_size") || !quant.at("group_size").is_number_integer())
    throw InputError(f->path() + ": INT4 weights but the header has no integer quantization.group_size");
  w.group = quant.at("group_size").get<int64_t>();
  if (w.group != 32 && w.group != 64 && w.group != 128)
    throw InputError(f->path() + ": quantization.group_size " + std::to_string(w.group) + " is not 32, 64 or 128");
  const int64_t ng = (in + w.group - 1) / w.group;
  const SqmBytes packed = checked_raw(f, base + ".weight", w.asym ? SqmDType::U4x2 : SqmDType::I4x2, {out, in});
  w.packed = ops::PackedStorage<unsigned char>::borrow(packed.data, packed.size, f);  // the file's pages, not a copy
  if (f->has(base + ".weight_superblock_scale")) {  // K-quant (Q4_K) scales: Δ and m expanded from them
    if (w.group != 32 || !w.asym)
      throw InputError(f->path() + ": tensor '" + base + ".weight_superblock_scale' needs group size 32 and U4x2 codes (Q4_K)");
    w.superblock_scales = load_bytes(f, base + ".weight_superblock_scale", SqmDType::U8, {out, q4k_superblocks(ng), kQ4kHeadBytes});
    try {
      expand_q4k_scales(w);
    } catch (const std::invalid_argument& e) {
      throw InputError(f->path() + ": tensor '" + base + ".weight_superblock_scale': " + e.what());
    }
    return w;
  }
  const SqmBytes scales = checked_raw(f, base + ".weight_scale", SqmDType::F16, {out, ng});
  w.scales_f16.resize(scales.size / 2);
  std::memcpy(w.scales_f16.data(), scales.data, scales.size);
  if (w.asym) w.zeros_packed = load_bytes(f, base + ".weight_zero", SqmDType::U4x2, {out, ng});
  return w;
}

/// A W4A16 projection (load_int4_weights).
std::unique_ptr<Linear> load_int4_linear(const std::shared_ptr<SqmFile>& f, const std::string& base, int64_t out, int64_t in,
                                         const nlohmann::json& quant, Tensor bias) {
  try {
    return std::make_unique<W4A16Linear>(load_int4_weights(f, base, out, in, quant), std::move(bias));
  } catch (const std::invalid_argument& e) {
    throw InputError(f->path() + ": tensor '" + base + ".weight': " + e.what());
  }
}

/// A W4A4 (Atom) projection (docs/formats.md): weight I4x2 [out, in − n], weight_scale F16 [out, G],
/// weight_outlier I8 [out, n] + weight_outlier_scale F32 [out] or weight_outlier F32 [out, n],
/// act_clip F32 [1]; the reorder is the I32 tensor `order_name` (gathered sites; absent when the
/// site has no outliers) or none (down_proj: folded into gate/up rows).
std::unique_ptr<Linear> load_atom_linear(const std::shared_ptr<SqmFile>& f, const std::string& base, int64_t out, int64_t in,
                                         const nlohmann::json& quant, const std::string& order_name, Tensor bias) {
  W4A4LinearData d;
  d.out = out;
  d.in = in;
  if (!quant.contains("group_size") || !quant.at("group_size").is_number_integer())
    throw InputError(f->path() + ": W4A4 weights but the header has no integer quantization.group_size");
  d.group = quant.at("group_size").get<int64_t>();
  if (d.group != 0 && d.group != 32 && d.group != 64 && d.group != 128)
    throw InputError(f->path() + ": quantization.group_size " + std::to_string(d.group) + " is not 0, 32, 64 or 128");
  const std::string oname = base + ".weight_outlier";
  if (f->has(oname)) {
    const SqmTensorInfo& oi = f->info(oname);
    if (oi.shape.size() != 2 || oi.shape[0] != out || oi.shape[1] <= 0 || oi.shape[1] >= in)
      throw InputError(f->path() + ": tensor '" + oname + "' has shape " + shape_to_string(oi.shape) + ", expected [" +
                       std::to_string(out) + ", n] with 0 < n < " + std::to_string(in));
    d.n_outlier = oi.shape[1];
    d.outlier_format = oi.dtype == SqmDType::F32 ? W4A4OutlierFormat::Fp32 : W4A4OutlierFormat::Int8;
  }
  const int64_t inn = in - d.n_outlier, G = w4a4_stored_groups(inn, d.group);
  const std::vector<uint8_t> packed = load_bytes(f, base + ".weight", SqmDType::I4x2, {out, inn});
  d.codes.resize(static_cast<size_t>(out * inn));
  for (size_t i = 0; i < d.codes.size(); ++i) {
    const int nib = (i & 1) ? packed[i / 2] >> 4 : packed[i / 2] & 0xF;
    d.codes[i] = static_cast<int8_t>(nib >= 8 ? nib - 16 : nib);
  }
  const std::vector<uint8_t> scales = load_bytes(f, base + ".weight_scale", SqmDType::F16, {out, G});
  d.scales_f16.resize(scales.size() / 2);
  std::memcpy(d.scales_f16.data(), scales.data(), scales.size());
  if (d.n_outlier > 0 && d.outlier_format == W4A4OutlierFormat::Int8) {
    const std::vector<uint8_t> oc = load_bytes(f, oname, SqmDType::I8, {out, d.n_outlier});
    d.outlier_codes.assign(reinterpret_cast<const int8_t*>(oc.data()), reinterpret_cast<const int8_t*>(oc.data()) + oc.size());
    const Tensor os = load_float(f, base + ".weight_outlier_scale", {out});
    d.outlier_scales.assign(os.data(), os.data() + out);
  } else if (d.n_outlier > 0) {
    const Tensor ow = load_float(f, oname, {out, d.n_outlier});
    d.outlier_weights.assign(ow.data(), ow.data() + ow.numel());
  }
  d.act_clip = load_float(f, base + ".act_clip", {1}).data()[0];
  if (!order_name.empty() && f->has(order_name)) {
    const std::vector<uint8_t> ob = load_bytes(f, order_name, SqmDType::I32, {in});
    d.order.resize(static_cast<size_t>(in));
    std::memcpy(d.order.data(), ob.data(), ob.size());
  } else if (!order_name.empty() && d.n_outlier > 0) {
    throw InputError(f->path() + ": tensor '" + order_name + "' is missing (the reorder of " + base + "'s " +
                     std::to_string(d.n_outlier) + " outlier channels)");
  }
  d.bias = std::move(bias);
  try {
    return std::make_unique<W4A4Linear>(d);
  } catch (const std::invalid_argument& e) {
    throw InputError(f->path() + ": W4A4 projection '" + base + "': " + e.what());
  }
}

/// The reorder tensor of a linear's input site for Atom W4A4 (docs/formats.md): "model.layers.N.<site>.order",
/// "" for ffn_hidden (folded into the producing gate/up rows).
std::string atom_order_name(int layer, ActivationSite site) {
  if (site == ActivationSite::FfnHidden) return "";
  return names::layer(layer) + activation_site_name(site) + ".order";
}

/// header quantization.int8_activations ("fp32": the weight-only schemes' INT8 linears run as
/// W8A16), or head_activations, its name in files written before mixed precision; "" when absent.
std::string int8_activations(const nlohmann::json& quant) {
  return quant.value("int8_activations", quant.value("head_activations", std::string()));
}

std::unique_ptr<Linear> load_linear(const std::shared_ptr<SqmFile>& f, const std::string& base, int64_t out, int64_t in,
                                    bool has_bias, const nlohmann::json& quant, const std::string& order_name = "") {
  const std::string wname = base + ".weight";
  Tensor bias = has_bias ? load_float(f, base + ".bias", {out}) : Tensor();
  if (!f->has(wname)) throw InputError(f->path() + ": tensor '" + wname + "' is missing");
  const SqmTensorInfo& info = f->info(wname);
  if (info.dtype == SqmDType::I4x2 && quant.value("scheme", std::string()) == "w4a4-atom")
    return load_atom_linear(f, base, out, in, quant, order_name, bias);
  if (info.dtype == SqmDType::I4x2 || info.dtype == SqmDType::U4x2) return load_int4_linear(f, base, out, in, quant, bias);
  if (info.dtype != SqmDType::I8) return std::make_unique<DenseLinear>(load_float(f, wname, {out, in}), bias);
  if (info.shape != std::vector<int64_t>{out, in})
    throw InputError(f->path() + ": tensor '" + wname + "' has shape " + shape_to_string(info.shape) + ", expected " +
                     shape_to_string({out, in}));
  const std::string sname = base + ".weight_scale";
  if (!f->has(sname)) throw InputError(f->path() + ": tensor '" + sname + "' is missing");
  const int64_t n_scales = static_cast<int64_t>(f->info(sname).numel());
  if (n_scales != out && n_scales != 1)
    throw InputError(f->path() + ": tensor '" + sname + "' has " + std::to_string(n_scales) + " scales, expected " +
                     std::to_string(out) + " (per-channel) or 1 (per-tensor)");
  const Tensor scales = load_float(f, sname, f->info(sname).shape);
  if (int8_activations(quant) == "fp32") {
    // The INT8 linears of a weight-only file (the embedding / head, mixed-precision linears): W8A16.
    const SqmBytes raw = f->raw(wname);
    try {
      return std::make_unique<W8A16Linear>(ops::Int8Codes::borrow(reinterpret_cast<const int8_t*>(raw.data), raw.size, f),
                                           std::vector<float>(scales.data(), scales.data() + n_scales), out, in, bias);
    } catch (const std::invalid_argument& e) {
      throw InputError(f->path() + ": '" + base + "': " + e.what());
    }
  }
  const std::string act_name = quant.value("act", std::string("per-token"));
  const ActQuant act = parse_act(act_name, f->path());
  float static_step = 0.0f;
  if (act == ActQuant::PerTensorStatic) static_step = load_float(f, base + ".input_scale", {1}).data()[0];
  const SqmBytes raw = f->raw(wname);
  std::vector<int8_t> q(raw.size);
  std::memcpy(q.data(), raw.data, raw.size);
  return std::make_unique<W8A8Linear>(std::move(q), std::vector<float>(scales.data(), scales.data() + n_scales), out, in,
                                      n_scales == 1 ? WeightGranularity::PerTensor : WeightGranularity::PerChannel, act,
                                      static_step, bias);
}

/// A .sqm file as a WeightSource: float tensors widened to FP32, linears by their weight dtype;
/// the linears of a site the header rotates online (formats/rotation_header.h) wrapped in
/// HadamardInputLinear.
class SqmSource final : public WeightSource {
 public:
  SqmSource(const std::shared_ptr<SqmFile>& f, const nlohmann::json& quant)
      : f_(f), quant_(quant), rotation_(rotation_from_quantization(quant, f->path())) {}
  Tensor tensor(const std::string& name, const std::vector<int64_t>& shape) const override { return load_float(f_, name, shape); }
  std::unique_ptr<Linear> linear(const LinearSlot& s) const override {
    std::unique_ptr<Linear> lin = load_linear(f_, s.name, s.out, s.in, s.bias, quant_, atom_order_name(s.layer, s.site));
    const auto it = rotation_.online.find(activation_site_name(s.site));
    if (it == rotation_.online.end()) return lin;
    if (s.in % it->second != 0)
      throw InputError(f_->path() + ": header quantization.rotation.online." + it->first + " is " + std::to_string(it->second) +
                       ", which does not divide the " + std::to_string(s.in) + " inputs of '" + s.name + "'");
    return std::make_unique<HadamardInputLinear>(std::move(lin), it->second);
  }

 private:
  const std::shared_ptr<SqmFile>& f_;
  const nlohmann::json& quant_;
  RotationHeader rotation_;
};

}  // namespace

std::unique_ptr<Decoder> build_model_from_sqm(const std::shared_ptr<SqmFile>& f) {
  const nlohmann::json& h = f->header();
  const ModelConfig c = model_config_from_json(h.contains("model_config") ? h.at("model_config") : nlohmann::json(), f->path());
  const nlohmann::json quant = h.value("quantization", nlohmann::json::object());
  const std::string int8_act = int8_activations(quant);
  if (!int8_act.empty() && int8_act != "fp32")
    throw InputError(f->path() + ": header quantization.int8_activations is '" + int8_act + "', expected 'fp32'");
  const int64_t d = c.dim;
  check_layer_count(c.n_layers, f->names(), f->path() + ": model_config", "n_layers");  // before allocating per layer
  const SqmSource src(f, quant);
  std::vector<DecoderLayer> layers;
  layers.reserve(static_cast<size_t>(c.n_layers));
  // The linears read their packed codes (INT4 nibbles, W8A16 / embedding INT8 codes) and FP32
  // tensors from the mapping itself (zero-copy; ops/packed_storage.h); INT8 W8A8 weights, scales
  // and F16/BF16 tensors are copied into the kernels' layouts. After each layer the pages touched
  // while building it (checksums, copies) are released: the resident set holds each byte of the
  // model once, and the mapped ones are read again from the page cache when a forward touches them.
  for (int l = 0; l < c.n_layers; ++l) {
    layers.push_back(build_decoder_layer(c, l, src));
    f->mapping()->release(0, static_cast<size_t>(f->file_size()));
  }
  DecoderGlobals globals = build_decoder_globals(c, src);
  // --quantize-head: the embedding is INT8 rows (+ per-row scales); a tied LM head is the same
  // INT8 matrix run as a linear with per-output-channel (= per-row) scales: W8A8 (the activation
  // mode of header quantization.act) or, when quantization.int8_activations is "fp32" (the
  // weight-only schemes) or quantization.lm_head_activations is "fp32" (w8a8 --head-activations
  // fp32: the head alone), W8A16. With --token-embedding-type int4 the embedding is group-wise
  // INT4 rows, and a tied head the same INT4 matrix run as a W4A16 linear.
  nlohmann::json head_quant = quant;
  if (quant.contains("lm_head_activations")) {
    if (quant.at("lm_head_activations") != "fp32")
      throw InputError(f->path() + ": header quantization.lm_head_activations is " + quant.at("lm_head_activations").dump() +
                       ", expected \"fp32\"");
    head_quant["int8_activations"] = "fp32";
  }
  const SqmDType embed_dtype = f->has(names::kEmbed) ? f->info(names::kEmbed).dtype : SqmDType::F32;
  const bool embed_int4 = embed_dtype == SqmDType::I4x2 || embed_dtype == SqmDType::U4x2;
  const bool embed_q = embed_dtype == SqmDType::I8 || embed_int4;
  Tensor embed = embed_q ? Tensor() : load_float(f, names::kEmbed, {c.vocab_size, d});
  std::unique_ptr<Linear> head;
  if (c.tied_embeddings && !f->has(names::kLmHead))
    head = embed_q ? load_linear(f, "model.embed_tokens", c.vocab_size, d, false, head_quant) : std::make_unique<DenseLinear>(embed);
  else
    head = load_linear(f, "lm_head", c.vocab_size, d, false, head_quant);
  auto model = std::make_unique<Decoder>(c, embed, std::move(layers), load_float(f, names::kFinalNorm, {d}), std::move(head),
                                         std::move(globals));
  if (embed_int4) {
    // --token-embedding-type int4: the W4A16 layout of the file's linears (its group size).
    try {
      model->set_quantized_embedding(load_int4_weights(f, "model.embed_tokens", c.vocab_size, d, quant));
    } catch (const std::invalid_argument& e) {
      throw InputError(f->path() + ": tensor '" + std::string(names::kEmbed) + "': " + e.what());
    }
  } else if (embed_q) {
    const SqmBytes q = f->raw(names::kEmbed);
    const std::string sname = "model.embed_tokens.weight_scale";
    if (!f->has(sname) || f->info(sname).numel() != static_cast<uint64_t>(c.vocab_size))
      throw InputError(f->path() + ": INT8 embedding needs '" + sname + "' with " + std::to_string(c.vocab_size) + " per-row scales");
    const Tensor scales = load_float(f, sname, {c.vocab_size});
    model->set_quantized_embedding(ops::Int8Codes::borrow(reinterpret_cast<const int8_t*>(q.data), q.size, f),
                                   std::vector<float>(scales.data(), scales.data() + c.vocab_size));
  }
  if (const int64_t kb = rotation_from_quantization(quant, f->path()).kv_keys; kb > 0) {
    if (c.head_dim % kb != 0)
      throw InputError(f->path() + ": header quantization.rotation.kv_keys is " + std::to_string(kb) + ", which does not divide head_dim " +
                       std::to_string(c.head_dim));
    model->set_key_rotation(kb);
  }
  return model;
}

void check_sqm_finite(const SqmFile& f) {
  for (const SqmTensorInfo& info : f.tensors()) {
    if (info.dtype != SqmDType::F32 && info.dtype != SqmDType::F16 && info.dtype != SqmDType::BF16) continue;
    const SqmBytes raw = f.raw(info.name);
    const int64_t n = static_cast<int64_t>(info.numel());
    int64_t i = -1;
    float v = 0.0f;
    if (info.dtype == SqmDType::F32) {
      // The mapping is 64-byte aligned and a decompressed buffer is malloc-aligned.
      const auto* x = reinterpret_cast<const float*>(raw.data);
      i = first_nonfinite_f32(x, n);
      if (i >= 0) v = x[i];
    } else {
      const auto* h = reinterpret_cast<const uint16_t*>(raw.data);
      const bool f16 = info.dtype == SqmDType::F16;
      i = f16 ? first_nonfinite_f16(h, n) : first_nonfinite_bf16(h, n);
      if (i >= 0) v = f16 ? half_to_float(h[i]) : bf16_to_float(h[i]);
    }
    if (i >= 0)
      throw NonFiniteError(f.path() + ": tensor '" + info.name + "' (" + sqm_dtype_name(info.dtype) +
                           ") holds a non-finite value (" + nonfinite_name(v) + ") at " + element_position(i, info.shape));
  }
}

std::unique_ptr<Tokenizer> tokenizer_from_sqm(const SqmFile& f) {
  const nlohmann::json& h = f.header();
  if (!h.contains("tokenizer") || !h.at("tokenizer").contains("tensor")) return nullptr;
  const std::string name = h.at("tokenizer").at("tensor").get<std::string>();
  if (!f.has(name)) throw InputError(f.path() + ": header names tokenizer tensor '" + name + "' but the file has none");
  const SqmBytes raw = f.raw(name);
  return load_tokenizer_from_bytes(raw.data, raw.size, f.path() + ":" + name);
}

}  // namespace sq
