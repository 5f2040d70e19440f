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
#include "formats/hf_architecture.h"
#include "formats/hf_config.h"
#include "formats/hf_plan.h"
#include "formats/mapped_file.h"
#include "formats/safetensors.h"

namespace sq {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";


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

namespace {

/// The safetensors file(s) of a checkpoint directory as an HfTensorSource. Names are the file's,
/// or base_prefix + the file's for a checkpoint saved from the base model class (see
/// HfArchitecture::base_prefix).
class SafetensorsSource : public HfTensorSource {
 public:
  SafetensorsSource(std::string dir, std::string config_source, std::string index)
      : dir_(std::move(dir)), config_source_(std::move(config_source)), index_(std::move(index)) {}

  void add(const std::string& name, const std::string& stored, const SafetensorsFile* f) { location_[name] = {stored, f}; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    out.reserve(location_.size());
    for (const auto& [name, where] : location_) out.push_back(name);
    return out;
  }

  const std::vector<int64_t>* shape(const std::string& name) const override {
    const auto* w = find(name);
    return w ? &w->second->shape(w->first) : nullptr;
  }
  std::string file(const std::string& name) const override { return find(name)->second->path(); }
  const std::string& source() const override { return dir_; }
  const std::string& config_source() const override { return config_source_; }

 protected:
  Tensor load(const std::string& name) const override {
    const auto* w = find(name);
    return w->second->load_f32(w->first);
  }

 private:
  /// (stored name, file), or nullptr; InputError when the index places the tensor in a shard
  /// that does not hold it.
  const std::pair<std::string, const SafetensorsFile*>* find(const std::string& name) const {
    auto it = location_.find(name);
    if (it == location_.end()) return nullptr;
    if (!it->second.second->has(it->second.first))
      throw InputError(index_ + ": weight_map places tensor '" + it->second.first + "' in " + it->second.second->path() +
                       ", which has no such tensor");
    return &it->second;
  }

  std::string dir_, config_source_, index_;
  std::map<std::string, std::pair<std::string, const SafetensorsFile*>> location_;
};

}  // namespace

struct HfCheckpointReader::State {
  std::string dir, config_path;
  const HfArchitecture* arch = nullptr;
  ModelConfig parsed;  ///< config.json's, before map_tensors refines it
  ModelConfig config;  ///< refined: config()
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files;  ///< shard file name -> file, kept open
  std::unique_ptr<SafetensorsSource> source;                        ///< points into `files`
};

HfCheckpointReader::HfCheckpointReader(const std::string& dir) {
  {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw InputError("cannot open " + dir + ": not a Hugging Face checkpoint directory");
  }
  auto st = std::make_unique<State>();
  st->dir = dir;
  st->config_path = dir + "/config.json";
  st->parsed = load_hf_config(st->config_path);
  const ModelConfig& c = st->parsed;
  st->arch = hf_architecture_named(c.architecture);
  const HfArchitecture& arch = *st->arch;

  // Where each tensor lives.
  auto& files = st->files;
  std::map<std::string, const SafetensorsFile*> stored;  // tensor name in the files -> file
  const std::string single = dir + "/" + kSingleFile;
  const std::string index = dir + "/" + kIndexFile;
  if (is_regular_file(single)) {
    auto f = std::make_shared<SafetensorsFile>(single);
    files[kSingleFile] = f;
    for (const auto& n : f->names()) stored[n] = f.get();
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
    for (const auto& [tensor, shard] : weight_map) stored[tensor] = files.at(shard).get();
  } else {
    throw InputError(dir + ": no " + kSingleFile + " or " + kIndexFile + " in the checkpoint directory");
  }
  // A checkpoint saved from the base model class has no tensor under the *ForCausalLM prefix.
  const std::string prefix = arch.base_prefix ? arch.base_prefix : "";
  bool prefixed = prefix.empty();
  for (const auto& [name, f] : stored) prefixed = prefixed || name.compare(0, prefix.size(), prefix) == 0;
  st->source = std::make_unique<SafetensorsSource>(dir, st->config_path, index);
  SafetensorsSource& source = *st->source;
  for (const auto& [name, f] : stored) source.add(prefixed ? name : prefix + name, name, f);

  // Config dimensions against the tensor headers before anything per layer (num_hidden_layers = 1e9
  // would otherwise build a billion-entry list first): the layer count under the architecture's
  // layer prefix, and the sizes of the tensors that carry canonical names.
  ConfigKeyNames keys;
  keys.n_layers = arch.layers_key;
  keys.layer_prefix = arch.layer_prefix;
  check_config_against_tensors(c, source.names(), [&](const std::string& name) { return source.shape(name); },
                               st->config_path, keys);

  // The refined config: map_tensors with no globals and no layer selected reads only what a
  // refinement needs.
  st->config = c;
  CanonicalTensors nothing;
  arch.map_tensors(source, HfTensorSelection{.globals = false, .first_layer = 0, .end_layer = 0}, st->config, nothing);
  state_ = std::move(st);
}

HfCheckpointReader::~HfCheckpointReader() = default;
HfCheckpointReader::HfCheckpointReader(HfCheckpointReader&&) noexcept = default;
HfCheckpointReader& HfCheckpointReader::operator=(HfCheckpointReader&&) noexcept = default;

const std::string& HfCheckpointReader::dir() const { return state_->dir; }

const ModelConfig& HfCheckpointReader::config() const { return state_->config; }

Checkpoint HfCheckpointReader::load(const HfTensorSelection& selection) const {
  const State& st = *state_;
  const int n = st.config.n_layers, first = selection.first_layer, end = selection.end_layer;
  if (first < 0 || first > n || end < first || (end > n && end != HfTensorSelection::kToLastLayer)) {
    const std::string which =
        int64_t(end) == int64_t(first) + 1 ? "layer " + std::to_string(first) + " is"
        : end == HfTensorSelection::kToLastLayer ? "layers from " + std::to_string(first) + " on are"
                                                 : "layers [" + std::to_string(first) + ", " + std::to_string(end) + ") are";
    throw UsageError(st.dir + ": " + which + " out of range: the checkpoint has " + std::to_string(n) + " layers (" +
                     st.arch->layers_key + " = " + std::to_string(n) + ")");
  }
  Checkpoint ckpt;
  ckpt.source = st.dir;
  ckpt.format = "hf-safetensors";
  ckpt.config = st.parsed;
  st.arch->map_tensors(*st.source, selection, ckpt.config, ckpt.tensors);
  return ckpt;
}

Checkpoint load_hf_checkpoint(const std::string& dir) { return HfCheckpointReader(dir).load(HfTensorSelection::all()); }

namespace {

/// The torch_dtype of config.json for a storage dtype; UsageError for another.
const char* torch_dtype_of(const std::string& dtype) {
  const char* t = dtype == "F32" ? "float32" : dtype == "F16" ? "float16" : dtype == "BF16" ? "bfloat16" : nullptr;
  if (!t) throw UsageError("cannot save a Hugging Face checkpoint with dtype '" + dtype + "' (expected F32, F16 or BF16)");
  return t;
}

/// Writes `outputs` (file order) into `dir` as model.safetensors (shards == 1) or `shards`
/// contiguous byte-balanced shards plus the index, then `config_json`; see save_hf_checkpoint.
void write_hf_directory(const std::string& dir, const std::vector<SafetensorsOutput>& outputs, const std::string& dtype,
                        int shards, const nlohmann::ordered_json& config_json) {
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
    for (const auto& o : outputs) total += uint64_t(o.numel()) * esize;
    // Contiguous groups balanced by bytes; every shard gets at least one tensor.
    std::vector<std::vector<SafetensorsOutput>> groups(static_cast<size_t>(shards));
    size_t s = 0;
    uint64_t acc = 0;
    for (size_t k = 0; k < outputs.size(); ++k) {
      groups[s].push_back(outputs[k]);
      acc += uint64_t(outputs[k].numel()) * esize;
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

}  // namespace

void save_hf_checkpoint(const Checkpoint& ckpt, const std::string& dir, const std::string& dtype, int shards) {
  const char* torch_dtype = torch_dtype_of(dtype);
  ModelConfig c = ckpt.config;
  c.validate(ckpt.source);
  ModelConfig written = c;  // the config that is written: HF checkpoints are half-split
  written.rope_layout = RopeLayout::HalfSplit;
  const nlohmann::ordered_json config_json = make_hf_config_json(written, torch_dtype);  // UnsupportedError unless writable
  // The architecture's write plan (rows of canonical tensors; q/k rows reordered to half-split when
  // the checkpoint's layout is interleaved), shapes checked against the config.
  const auto lookup = [&](const std::string& name) {
    auto it = ckpt.tensors.find(name);
    return it == ckpt.tensors.end() ? Tensor() : it->second;
  };
  std::vector<SafetensorsOutput> outputs;
  for (auto& [name, tensor] : plan_float_tensors(c, hf_write_plan(c), lookup, ckpt.source)) outputs.push_back({name, dtype, tensor});
  write_hf_directory(dir, outputs, dtype, shards, config_json);
}

void save_hf_checkpoint_generated(const ModelConfig& config, const std::vector<GeneratedTensor>& tensors,
                                  const std::string& dir, const std::string& dtype, int shards) {
  const char* torch_dtype = torch_dtype_of(dtype);
  config.validate("generated checkpoint");
  if (config.rope_layout != RopeLayout::HalfSplit)
    throw UnsupportedError("cannot write generated tensors with interleaved q/k rows (HF checkpoints are half-split)");
  const nlohmann::ordered_json config_json = make_hf_config_json(config, torch_dtype);
  std::map<std::string, const GeneratedTensor*> by_name;
  for (const auto& t : tensors) by_name[t.name] = &t;
  std::vector<SafetensorsOutput> outputs;
  auto add = [&](const std::string& hf_name, const std::string& canonical, const std::string& entry) {
    auto it = by_name.find(canonical);
    if (it == by_name.end()) throw InputError("generated checkpoint: tensor '" + canonical + "' is missing (for " + entry + ")");
    SafetensorsOutput o;
    o.name = hf_name;
    o.dtype = dtype;
    o.raw_shape = it->second->shape;
    o.generate = it->second->generate;
    outputs.push_back(std::move(o));
  };
  for (const HfPlanEntry& e : hf_write_plan(config)) {
    if (e.sources.size() != 1 || !e.rows.empty() || e.add != 0.0f || e.conv1d || e.zero_bias)
      throw UnsupportedError("cannot write generated tensors for architecture '" + config.architecture + "': its entry '" +
                             e.name + "' is not one canonical tensor stored unchanged");
    if (!e.linear) {
      add(e.name, e.sources[0], e.name);
      continue;
    }
    add(e.name + ".weight", e.sources[0] + ".weight", e.name);
    if (by_name.count(e.sources[0] + ".bias")) add(e.name + ".bias", e.sources[0] + ".bias", e.name);
  }
  write_hf_directory(dir, outputs, dtype, shards, config_json);
}

}  // namespace sq
