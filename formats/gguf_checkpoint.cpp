#include "formats/gguf_checkpoint.h"

#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/config_tensor_check.h"
#include "formats/file_magic.h"
#include "formats/gguf_architecture.h"
#include "formats/gguf_dequantize.h"

namespace sq {

namespace {

constexpr int kMaxSize = 1 << 24;  // bound on every size key, as for llama2.c headers

const GgufArchitecture& architecture_of(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture");
  const GgufArchitecture* a = find_gguf_architecture(arch);
  if (!a)
    throw UnsupportedError(f.path() + ": GGUF architecture '" + arch + "' is not supported yet (supported: " +
                           supported_gguf_architectures() + ")");
  return *a;
}

int size_key(const GgufFile& f, const std::string& key) {
  const int32_t v = f.get_i32(key);
  if (v <= 0 || v > kMaxSize)
    throw InputError(f.path() + ": metadata key '" + key + "' = " + std::to_string(v) + " is outside 1.." +
                     std::to_string(kMaxSize));
  return v;
}

RopeScaling rope_scaling_of(const GgufFile& f, const std::string& arch) {
  const std::string type_key = arch + ".rope.scaling.type", factor_key = arch + ".rope.scaling.factor",
                    legacy_key = arch + ".rope.scale_linear";
  // llama.cpp (llama_model::load_hparams): the type defaults to "linear"; the factor comes from
  // rope.scaling.factor, else rope.scale_linear, and 0 / absent means no scaling.
  const std::string type = f.has(type_key) ? f.get_string(type_key) : "linear";
  RopeScaling s;
  if (type == "none") return s;
  if (type != "linear")
    throw UnsupportedError(f.path() + ": metadata key '" + type_key + "' = '" + type +
                           "': RoPE scaling type not supported (supported: none, linear)");
  float factor = 0.0f;
  if (f.has(factor_key)) factor = f.get_f32(factor_key);
  else if (f.has(legacy_key)) factor = f.get_f32(legacy_key);
  if (factor == 0.0f || factor == 1.0f) return s;
  if (!(factor > 0.0f) || !std::isfinite(factor))
    throw InputError(f.path() + ": metadata key '" + (f.has(factor_key) ? factor_key : legacy_key) + "' = " +
                     std::to_string(factor) + " is not a finite positive RoPE scaling factor");
  s.type = RopeScalingType::Linear;
  s.factor = factor;
  return s;
}

/// The DecoderSpec of architecture `a` for config `c` (sizes, rope_theta already set): the table's
/// layer structure plus what llama.cpp derives or hard-codes (formats/gguf_architecture.h).
DecoderSpec spec_of(const GgufFile& f, const GgufArchitecture& a, const ModelConfig& c) {
  const std::string p = std::string(a.name) + ".";
  for (const GgufRefusedKey& k : a.refused_keys) {
    const std::string key = p + k.suffix;
    if (!f.has(key)) continue;
    const float v = f.get_f32(key);
    if (v != 0.0f)
      throw UnsupportedError(f.path() + ": metadata key '" + key + "' = " + std::to_string(v) + ": " + k.feature +
                             " is not supported");
  }
  DecoderSpec s = a.spec;
  s.embed_scale = a.embed_scale == GgufEmbedScale::SqrtDim ? std::sqrt(static_cast<float>(c.dim)) : 1.0f;
  s.attn_scale = a.attn_scale ? a.attn_scale(c) : 0.0f;
  s.layer_window.clear();
  s.rope_local_theta = 0.0f;
  const GgufSlidingWindow& w = a.sliding_window;
  const std::string window_key = w.key_suffix ? p + w.key_suffix : std::string();
  if (w.key_suffix && f.has(window_key) && f.get_i32(window_key) != 0) {
    const int window = size_key(f, window_key);
    s.layer_window.resize(static_cast<size_t>(c.n_layers));
    for (int l = 0; l < c.n_layers; ++l)
      s.layer_window[static_cast<size_t>(l)] = w.pattern == 0 || l % w.pattern < w.pattern - 1 ? window : 0;
    s.rope_local_theta = w.local_rope_theta;
  }
  return s;
}

/// One tensor to load: its GGUF info, canonical name, expected row-major shape and rule.
struct Planned {
  const GgufTensorInfo* info = nullptr;
  std::string gguf_name, canonical;
  std::vector<int64_t> shape;
  const GgufTensorRule* rule = nullptr;
};

/// The layer index of canonical name "model.layers.N.…", −1 for a global tensor.
int layer_of_canonical(const std::string& canonical) {
  const std::string prefix = "model.layers.";
  if (canonical.compare(0, prefix.size(), prefix) != 0) return -1;
  return std::stoi(canonical.substr(prefix.size()));
}

/// Dequantizes `p` into a new owned tensor; q/k rows go from llama.cpp's interleaved order back to
/// the HF half-split order (GGUF row h*d + 2i + j -> row h*d + j*d/2 + i), see the header.
/// The tensor's mapped pages are released afterwards (MappedFile::release): the resident set of a
/// load holds the FP32 weights, not also the file they came from (Qwen2.5-Coder-1.5B: 7.1 GB, not
/// 7.1 + 1.1 GB).
Tensor dequantize_planned(const GgufFile& file, const Planned& p, const ModelConfig& c) {
  Tensor t = Tensor::zeros(p.shape);
  float* dst = t.mutable_data();
  const GgufTensorInfo& info = *p.info;
  struct Release {
    const GgufFile& f;
    const GgufTensorInfo& i;
    ~Release() { f.mapping()->release(f.data_offset() + i.offset, i.nbytes); }
  } release{file, info};
  if (p.rule->qk == GgufQkRows::None) {
    dequantize_tensor_rows(file, info, 0, info.rows(), dst);
    return t;
  }
  const int heads = p.rule->qk == GgufQkRows::Query ? c.n_heads : c.n_kv_heads, hd = c.head_dim, half = hd / 2;
  const int64_t cols = info.row_length();
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < half; ++i)
      for (int j = 0; j < 2; ++j) {
        const int64_t from = int64_t(h) * hd + 2 * i + j, to = int64_t(h) * hd + int64_t(j) * half + i;
        dequantize_tensor_rows(file, info, from, from + 1, dst + to * cols);
      }
  return t;
}

}  // namespace

bool looks_like_gguf(const std::string& path) { return path.ends_with(".gguf") || file_starts_with(path, "GGUF"); }

ModelConfig gguf_model_config(const GgufFile& f) {
  const GgufArchitecture& a = architecture_of(f);
  const std::string arch = a.name, p = arch + ".";
  ModelConfig c;
  c.architecture = a.config_architecture;
  for (const GgufIntKey& k : a.int_keys) {
    const std::string key = p + k.suffix;
    if (f.has(key) || k.required) c.*k.field = size_key(f, key);
    else if (k.default_from) c.*k.field = c.*k.default_from;
  }
  for (const GgufFloatKey& k : a.float_keys) {
    const std::string key = p + k.suffix;
    if (f.has(key) || k.required) {
      const float v = f.get_f32(key);
      if (!(v > 0.0f) || !std::isfinite(v))
        throw InputError(f.path() + ": metadata key '" + key + "' = " + std::to_string(v) + " must be finite and positive");
      c.*k.field = v;
    } else {
      c.*k.field = k.default_value;
    }
  }

  // head_dim: attention.key_length, else embedding_length / head_count (llama.cpp's n_embd_head_k).
  const std::string key_length = p + "attention.key_length", value_length = p + "attention.value_length",
                    rope_dims = p + "rope.dimension_count";
  if (f.has(key_length)) {
    c.head_dim = size_key(f, key_length);
  } else {
    if (c.dim % c.n_heads != 0)
      throw InputError(f.path() + ": " + p + "embedding_length = " + std::to_string(c.dim) + " is not a multiple of " + p +
                       "attention.head_count = " + std::to_string(c.n_heads) + " (and " + key_length + " is absent)");
    c.head_dim = c.dim / c.n_heads;
  }
  if (f.has(value_length) && size_key(f, value_length) != c.head_dim)
    throw UnsupportedError(f.path() + ": metadata key '" + value_length + "' = " + std::to_string(f.get_i32(value_length)) +
                           " differs from the key head size " + std::to_string(c.head_dim) + " (not supported)");
  if (f.has(rope_dims) && size_key(f, rope_dims) != c.head_dim)
    throw UnsupportedError(f.path() + ": metadata key '" + rope_dims + "' = " + std::to_string(f.get_i32(rope_dims)) +
                           " is not the head size " + std::to_string(c.head_dim) + " (partial rotary embedding is not supported)");

  const std::string vocab_key = p + "vocab_size", tokens_key = "tokenizer.ggml.tokens";
  if (f.has(vocab_key)) {
    c.vocab_size = size_key(f, vocab_key);
  } else if (f.has(tokens_key)) {
    const uint64_t n = f.get_array_size(tokens_key);
    if (n == 0 || n > uint64_t(kMaxSize))
      throw InputError(f.path() + ": metadata key '" + tokens_key + "' has " + std::to_string(n) + " tokens (expected 1.." +
                       std::to_string(kMaxSize) + ")");
    c.vocab_size = int(n);
  } else {
    throw InputError(f.path() + ": the vocabulary size is unknown: neither metadata key '" + vocab_key + "' nor '" +
                     tokens_key + "' is present");
  }

  c.rope_scaling = rope_scaling_of(f, arch);
  // llama: q/k rows are restored to the HF order (see the header); NEOX-RoPE architectures
  // (gemma3) store them in that order already.
  c.rope_layout = RopeLayout::HalfSplit;
  c.spec = spec_of(f, a, c);
  c.qkv_bias = a.qkv_bias;
  c.tied_embeddings = true;
  for (const GgufTensorRule& r : a.global_tensors)
    if (r.optional && std::strcmp(r.canonical, names::kLmHead) == 0) c.tied_embeddings = !f.has_tensor(r.gguf);
  if (f.has("tokenizer.ggml.bos_token_id")) c.bos_id = f.get_i32("tokenizer.ggml.bos_token_id");
  if (f.has("tokenizer.ggml.eos_token_id")) c.eos_id = f.get_i32("tokenizer.ggml.eos_token_id");
  c.validate(f.path());
  return c;
}

namespace {
/// The config and every tensor of the file mapped to its canonical name, the config checked against
/// the tensor shapes (load_gguf_checkpoint's first step; gguf_checked_model_config).
std::pair<ModelConfig, std::map<std::string, Planned>> plan_gguf_tensors(const GgufFile& file) {
  const GgufArchitecture& a = architecture_of(file);
  std::pair<ModelConfig, std::map<std::string, Planned>> out;
  out.first = gguf_model_config(file);
  const ModelConfig& c = out.first;
  std::map<std::string, Planned>& by_canonical = out.second;
  const std::string arch = a.name;

  // Every tensor of the file mapped to a canonical name (bounded by the file, not by the config).
  for (const GgufTensorInfo& info : file.tensors()) {
    Planned p;
    p.info = &info;
    p.gguf_name = info.name;
    for (const GgufTensorRule& r : a.global_tensors)
      if (info.name == r.gguf) {
        p.rule = &r;
        p.canonical = r.canonical;
      }
    std::string rest;
    const int64_t block = p.rule ? -1 : numbered_name_index(info.name, "blk.", &rest);
    if (block >= 0) {
      for (const GgufTensorRule& r : a.layer_tensors)
        if (rest == r.gguf) {
          p.rule = &r;
          p.canonical = names::layer(int(block)) + r.canonical;
        }
      if (p.rule && block >= c.n_layers)
        throw InputError(file.path() + ": tensor '" + info.name + "' belongs to block " + std::to_string(block) + ", but " +
                         arch + ".block_count = " + std::to_string(c.n_layers));
    }
    if (!p.rule)
      throw UnsupportedError(file.path() + ": tensor '" + info.name + "' has no mapping for GGUF architecture '" + arch +
                             "' (not supported; sqkit does not drop weights it does not understand)");
    by_canonical[p.canonical] = p;
  }

  // The config against the tensor shapes before anything per layer.
  std::vector<std::string> canonical_names;
  canonical_names.reserve(by_canonical.size());
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, p] : by_canonical) {
    canonical_names.push_back(name);
    shapes[name] = p.info->shape();
  }
  const std::string k_layers = arch + ".block_count", k_dim = arch + ".embedding_length",
                    k_vocab = arch + ".vocab_size", k_heads = arch + ".attention.head_count",
                    k_kv = arch + ".attention.head_count_kv", k_hidden = arch + ".feed_forward_length";
  ConfigKeyNames keys;
  keys.n_layers = k_layers.c_str();
  keys.dim = k_dim.c_str();
  keys.vocab_size = k_vocab.c_str();
  keys.n_heads = k_heads.c_str();
  keys.n_kv_heads = k_kv.c_str();
  keys.hidden_dim = k_hidden.c_str();
  check_config_against_tensors(
      c, canonical_names,
      [&](const std::string& name) -> const std::vector<int64_t>* {
        auto it = shapes.find(name);
        return it == shapes.end() ? nullptr : &it->second;
      },
      file.path(), keys);
  return out;
}
}  // namespace

ModelConfig gguf_checked_model_config(const GgufFile& file) { return plan_gguf_tensors(file).first; }

Checkpoint load_gguf_checkpoint(const GgufFile& file) { return load_gguf_checkpoint(file, HfTensorSelection::all()); }

Checkpoint load_gguf_checkpoint(const GgufFile& file, const HfTensorSelection& selection) {
  const GgufArchitecture& a = architecture_of(file);
  Checkpoint ck;
  ck.source = file.path();
  ck.format = "gguf";
  auto [config, by_canonical] = plan_gguf_tensors(file);
  ck.config = config;
  const ModelConfig& c = ck.config;
  const std::string arch = a.name;

  // Every implied tensor present, of the right shape and a type we can dequantize.
  std::vector<Planned> plan;
  auto expect = [&](const GgufTensorRule& r, const std::string& gguf_name, const std::string& canonical) {
    std::vector<int64_t> shape;
    for (GgufDim d : r.shape) shape.push_back(gguf_dim_size(d, c));
    auto it = by_canonical.find(canonical);
    if (it == by_canonical.end()) {
      if (r.optional) return;
      throw InputError(file.path() + ": tensor '" + gguf_name + "' (" + canonical + ", shape " + shape_to_string(shape) +
                       ") is missing");
    }
    Planned p = it->second;
    const GgufTensorInfo& info = *p.info;
    if (info.shape() != shape) {
      std::vector<int64_t> ggml_dims(shape.rbegin(), shape.rend());
      throw InputError(file.path() + ": tensor '" + gguf_name + "' has GGUF dims " + shape_to_string(info.dims) +
                       " (row-major " + shape_to_string(info.shape()) + "), expected dims " + shape_to_string(ggml_dims) +
                       " (row-major " + shape_to_string(shape) + ") from the metadata");
    }
    if (!ggml_can_dequantize(info.type))
      throw UnsupportedError(file.path() + ": tensor '" + gguf_name + "' has ggml type " +
                             ggml_type_name(uint32_t(info.type)) + ", which sqkit cannot dequantize");
    p.shape = std::move(shape);
    plan.push_back(std::move(p));
  };
  for (const GgufTensorRule& r : a.global_tensors) expect(r, r.gguf, r.canonical);
  for (int l = 0; l < c.n_layers; ++l)
    for (const GgufTensorRule& r : a.layer_tensors)
      expect(r, "blk." + std::to_string(l) + "." + r.gguf, names::layer(l) + r.canonical);

  const int end = selection.end_layer == HfTensorSelection::kToLastLayer ? c.n_layers : selection.end_layer;
  if (selection.first_layer < 0 || end > c.n_layers)
    throw std::out_of_range(file.path() + ": layers [" + std::to_string(selection.first_layer) + ", " + std::to_string(end) +
                            ") selected of a model with " + std::to_string(c.n_layers) + " layers");
  // One selected tensor at a time, straight into its owned FP32 storage.
  for (const Planned& p : plan) {
    const int layer = layer_of_canonical(p.canonical);
    if (layer < 0 ? !selection.globals : !selection.layer(layer)) continue;
    ck.tensors[p.canonical] = dequantize_planned(file, p, c);
  }
  return ck;
}

Checkpoint load_gguf_checkpoint(const std::string& path) {
  const GgufFile file(path);
  return load_gguf_checkpoint(file);
}

}  // namespace sq
