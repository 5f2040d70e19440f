#include "formats/hf_checkpoint.h"

#include "formats/atomic_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "formats/config_tensor_check.h"
#include "formats/json_limits.h"
#include "formats/hf_config.h"
#include "formats/mapped_file.h"
#include "formats/safetensors.h"

namespace sq {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

struct Expected {
  std::string name;
  std::vector<int64_t> shape;
};

/// Every tensor `c` implies, in canonical (HF save) order.
std::vector<Expected> expected_tensors(const ModelConfig& c) {
  const int64_t d = c.dim, q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim,
                h = c.hidden_dim, v = c.vocab_size;
  std::vector<Expected> out;
  out.push_back({names::kEmbed, {v, d}});
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = names::layer(i);
    out.push_back({p + "input_layernorm.weight", {d}});
    out.push_back({p + "self_attn.q_proj.weight", {q, d}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, d}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, d}});
    if (c.qkv_bias) {
      out.push_back({p + "self_attn.q_proj.bias", {q}});
      out.push_back({p + "self_attn.k_proj.bias", {kv}});
      out.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    out.push_back({p + "self_attn.o_proj.weight", {d, q}});
    out.push_back({p + "post_attention_layernorm.weight", {d}});
    out.push_back({p + "mlp.gate_proj.weight", {h, d}});
    out.push_back({p + "mlp.up_proj.weight", {h, d}});
    out.push_back({p + "mlp.down_proj.weight", {d, h}});
  }
  out.push_back({names::kFinalNorm, {d}});
  if (!c.tied_embeddings) out.push_back({names::kLmHead, {v, d}});
  return out;
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

bool is_regular_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

/// Plain file name: no directory part, not "." / "..", no NUL.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
}

Tensor permute_rows(const Tensor& w, int n_heads, int head_dim, bool to_half_split, const char* fn) {
  if (head_dim <= 0 || head_dim % 2 != 0 || n_heads <= 0)
    throw InputError(std::string(fn) + ": head_dim must be even and positive and n_heads positive, got head_dim " +
                     std::to_string(head_dim) + ", n_heads " + std::to_string(n_heads));
  const int64_t rows = int64_t(n_heads) * head_dim;
  if ((w.rank() != 1 && w.rank() != 2) || w.dim(0) != rows)
    throw InputError(std::string(fn) + ": tensor of shape " + w.shape_string() + " does not have n_heads*head_dim = " +
                     std::to_string(rows) + " rows (rank 1 or 2 expected)");
  const int64_t cols = w.rank() == 2 ? w.dim(1) : 1;
  const int half = head_dim / 2;
  Tensor out = Tensor::zeros(w.shape());
  float* dst = out.mutable_data();
  const float* src = w.data();
  for (int h = 0; h < n_heads; ++h)
    for (int j = 0; j < 2; ++j)
      for (int i = 0; i < half; ++i) {
        const int64_t interleaved = int64_t(h) * head_dim + 2 * i + j;
        const int64_t half_split = int64_t(h) * head_dim + j * half + i;
        const int64_t to = to_half_split ? half_split : interleaved;
        const int64_t from = to_half_split ? interleaved : half_split;
        std::memcpy(dst + to * cols, src + from * cols, size_t(cols) * sizeof(float));
      }
  return out;
}

}  // namespace

std::map<std::string, std::string> parse_safetensors_index(std::string_view text, const std::string& path) {
  check_json_depth(text, path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    throw InputError(path + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw InputError(path + ": expected a JSON object with a \"weight_map\"");
  auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object())
    throw InputError(path + ": missing object \"weight_map\" (tensor name -> shard file name)");
  std::map<std::string, std::string> out;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string())
      throw InputError(path + ": weight_map entry for tensor '" + it.key() + "' must be a file name string, got " +
                       json_excerpt(it.value()));
    const std::string shard = it.value().get<std::string>();
    if (!is_plain_file_name(shard))
      throw InputError(path + ": weight_map maps tensor '" + it.key() + "' to '" + shard +
                       "', which is not a plain file name inside the checkpoint directory (no '/', '\\', '.' or '..')");
    out[it.key()] = shard;
  }
  return out;
}

Tensor permute_qk_rows_for_half_split(const Tensor& w, int n_heads, int head_dim) {
  return permute_rows(w, n_heads, head_dim, true, "permute_qk_rows_for_half_split");
}

Tensor permute_qk_rows_for_interleaved(const Tensor& w, int n_heads, int head_dim) {
  return permute_rows(w, n_heads, head_dim, false, "permute_qk_rows_for_interleaved");
}

Checkpoint load_hf_checkpoint(const std::string& dir) {
  {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw InputError("cannot open " + dir + ": not a Hugging Face checkpoint directory");
  }
  Checkpoint ckpt;
  ckpt.source = dir;
  ckpt.format = "hf-safetensors";
  ckpt.config = load_hf_config(dir + "/config.json");
  const ModelConfig& c = ckpt.config;

  // Where each tensor lives.
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files;  // shard file name -> file
  std::map<std::string, const SafetensorsFile*> location;          // tensor name -> file
  const std::string single = dir + "/" + kSingleFile;
  const std::string index = dir + "/" + kIndexFile;
  if (is_regular_file(single)) {
    auto f = std::make_shared<SafetensorsFile>(single);
    files[kSingleFile] = f;
    for (const auto& n : f->names()) location[n] = f.get();
  } else if (is_regular_file(index)) {
    const auto weight_map = parse_safetensors_index(read_file_to_string(index), index);
    for (const auto& [tensor, shard] : weight_map) {
      if (files.count(shard)) continue;
      const std::string shard_path = dir + "/" + shard;
      if (!is_regular_file(shard_path))
        throw InputError(index + ": weight_map names shard '" + shard + "' (for tensor '" + tensor + "'), but " +
                         shard_path + " does not exist");
      files[shard] = std::make_shared<SafetensorsFile>(shard_path);
    }
    for (const auto& [tensor, shard] : weight_map) {
      const SafetensorsFile* f = files.at(shard).get();
      location[tensor] = f;
    }
  } else {
    throw InputError(dir + ": no " + kSingleFile + " or " + kIndexFile + " in the checkpoint directory");
  }

  auto lookup = [&](const std::string& name) -> const SafetensorsFile* {
    auto it = location.find(name);
    if (it == location.end()) return nullptr;
    if (!it->second->has(name))
      throw InputError(index + ": weight_map places tensor '" + name + "' in " + it->second->path() +
                       ", which has no such tensor");
    return it->second;
  };

  // Config dimensions against the tensor headers before anything per layer (num_hidden_layers = 1e9
  // would otherwise build a billion-entry list first).
  std::vector<std::string> tensor_names;
  tensor_names.reserve(location.size());
  for (const auto& [name, f] : location) tensor_names.push_back(name);
  check_config_against_tensors(
      c, tensor_names,
      [&](const std::string& name) -> const std::vector<int64_t>* {
        const SafetensorsFile* f = lookup(name);
        return f ? &f->shape(name) : nullptr;
      },
      dir + "/config.json");

  const auto expected = expected_tensors(c);
  for (const auto& e : expected) {
    const SafetensorsFile* f = lookup(e.name);
    if (!f) continue;  // reported below by Checkpoint::get
    if (f->shape(e.name) != e.shape)
      throw InputError(f->path() + ": tensor '" + e.name + "' has shape " + shape_to_string(f->shape(e.name)) +
                       ", expected " + shape_to_string(e.shape) + " from " + dir + "/config.json");
    ckpt.tensors[e.name] = f->load_f32(e.name);
  }
  for (const auto& e : expected) ckpt.get(e.name, e.shape);  // missing -> InputError naming dir and tensor

  if (c.architecture == "llama" && c.qkv_bias) {
    // attention_bias also gives HF's o_proj a bias; sqkit has none, so accept it only when zero.
    for (int i = 0; i < c.n_layers; ++i) {
      const std::string name = names::layer(i) + "self_attn.o_proj.bias";
      const SafetensorsFile* f = lookup(name);
      if (!f) continue;
      const Tensor b = f->load_f32(name);
      for (int64_t k = 0; k < b.numel(); ++k)
        if (b.data()[k] != 0.0f)
          throw UnsupportedError(f->path() + ": tensor '" + name +
                                 "' is non-zero; an o_proj bias (attention_bias = true) is not supported");
    }
  }
  return ckpt;
}

void save_hf_checkpoint(const Checkpoint& ckpt, const std::string& dir, const std::string& dtype, int shards) {
  const char* torch_dtype = dtype == "F32" ? "float32" : dtype == "F16" ? "float16" : dtype == "BF16" ? "bfloat16" : nullptr;
  if (!torch_dtype)
    throw UsageError("cannot save a Hugging Face checkpoint with dtype '" + dtype + "' (expected F32, F16 or BF16)");
  ModelConfig c = ckpt.config;
  c.validate(ckpt.source);
  const bool permute = c.rope_layout == RopeLayout::Interleaved;
  c.rope_layout = RopeLayout::HalfSplit;
  const nlohmann::ordered_json config_json = make_hf_config_json(c, torch_dtype);

  std::vector<SafetensorsOutput> outputs;
  for (const auto& e : expected_tensors(c)) {
    Tensor t = ckpt.get(e.name, e.shape);
    if (permute) {
      if (ends_with(e.name, "self_attn.q_proj.weight") || ends_with(e.name, "self_attn.q_proj.bias"))
        t = permute_qk_rows_for_half_split(t, c.n_heads, c.head_dim);
      else if (ends_with(e.name, "self_attn.k_proj.weight") || ends_with(e.name, "self_attn.k_proj.bias"))
        t = permute_qk_rows_for_half_split(t, c.n_kv_heads, c.head_dim);
    }
    outputs.push_back({e.name, dtype, t});
    // HF Llama with attention_bias = true also has an o_proj bias: write zeros (sqkit has none).
    if (c.architecture == "llama" && c.qkv_bias && ends_with(e.name, "self_attn.o_proj.weight"))
      outputs.push_back({e.name.substr(0, e.name.size() - 6) + "bias", dtype, Tensor::zeros({c.dim})});
  }
  if (shards < 1 || size_t(shards) > outputs.size())
    throw UsageError("cannot split " + std::to_string(outputs.size()) + " tensors into " + std::to_string(shards) +
                     " shards (expected 1 to " + std::to_string(outputs.size()) + ")");

  {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec || !fs::is_directory(dir)) throw OutputError("cannot create directory " + dir + ": " + ec.message());
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  auto remove_stale = [&](const char* name) {
    const std::string p = dir + "/" + name;
    if (std::remove(p.c_str()) != 0 && errno != ENOENT)
      throw OutputError("cannot remove stale " + p + ": " + std::strerror(errno));
  };

  if (shards == 1) {
    remove_stale(kIndexFile);
    write_safetensors(dir + "/" + kSingleFile, outputs, metadata);
  } else {
    const size_t esize = safetensors_dtype_size(dtype);
    uint64_t total = 0;
    for (const auto& o : outputs) total += uint64_t(o.tensor.numel()) * esize;
    // Contiguous groups balanced by bytes; every shard gets at least one tensor.
    std::vector<std::vector<SafetensorsOutput>> groups(static_cast<size_t>(shards));
    size_t s = 0;
    uint64_t acc = 0;
    for (size_t k = 0; k < outputs.size(); ++k) {
      groups[s].push_back(outputs[k]);
      acc += uint64_t(outputs[k].tensor.numel()) * esize;
      const size_t tensors_left = outputs.size() - 1 - k, shards_left = size_t(shards) - 1 - s;
      if (shards_left > 0 && (tensors_left == shards_left || acc * uint64_t(shards) >= total * (s + 1))) ++s;
    }
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    std::map<std::string, std::string> sorted_map;  // HF writes the weight_map sorted by name
    for (size_t g = 0; g < groups.size(); ++g) {
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05d.safetensors", g + 1, shards);
      write_safetensors(dir + "/" + name, groups[g], metadata);
      for (const auto& o : groups[g]) sorted_map[o.name] = name;
    }
    for (const auto& [k, v] : sorted_map) weight_map[k] = v;
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = std::move(weight_map);
    remove_stale(kSingleFile);
    write_file_atomic(dir + "/" + kIndexFile, index.dump(2) + "\n");
  }
  write_file_atomic(dir + "/config.json", config_json.dump(2) + "\n");
}

}  // namespace sq
