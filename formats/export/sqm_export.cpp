#include "formats/export/sqm_export.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/tool_main.h"
#include "formats/atomic_file.h"
#include "formats/export/compressed_tensors_export.h"
#include "formats/gguf_file.h"
#include "formats/gguf_writer.h"
#include "formats/mapped_file.h"
#include "formats/rotation_header.h"
#include "formats/hf_config.h"
#include "formats/hf_plan.h"
#include "formats/safetensors.h"
#include "model/sqm_model.h"

namespace sq {

namespace fs = std::filesystem;

// ---- reading the .sqm --------------------------------------------------------------------------

namespace {

Tensor widen(const ExportInput& in, const std::string& name) {
  const SqmTensorInfo& info = in.file->info(name);
  const SqmBytes raw = in.file->raw(name);
  const int64_t n = int64_t(info.numel());
  std::vector<float> v(static_cast<size_t>(n));
  switch (info.dtype) {
    case SqmDType::F32:
      std::memcpy(v.data(), raw.data, raw.size);
      break;
    case SqmDType::F16:
    case SqmDType::BF16: {
      const auto* h = reinterpret_cast<const uint16_t*>(raw.data);
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] = info.dtype == SqmDType::F16 ? half_to_float(h[i]) : bf16_to_float(h[i]);
      break;
    }
    default:
      throw InputError(in.file->path() + ": tensor '" + name + "' has dtype " + sqm_dtype_name(info.dtype) +
                       ", expected F32, F16 or BF16");
  }
  return Tensor::from_vector(info.shape, std::move(v));
}

const SqmTensorInfo& expect(const ExportInput& in, const std::string& name, std::vector<SqmDType> dtypes,
                            const std::vector<int64_t>& shape) {
  if (!in.file->has(name))
    throw InputError(in.file->path() + ": tensor '" + name + "' is missing (expected shape " + shape_to_string(shape) + ")");
  const SqmTensorInfo& info = in.file->info(name);
  if (std::find(dtypes.begin(), dtypes.end(), info.dtype) == dtypes.end() || info.shape != shape)
    throw InputError(in.file->path() + ": tensor '" + name + "' is " + sqm_dtype_name(info.dtype) + " " + shape_to_string(info.shape) +
                     ", expected " + sqm_dtype_name(dtypes[0]) + " " + shape_to_string(shape));
  return info;
}

int nibble(const uint8_t* p, int64_t i) { return (i & 1) ? p[i / 2] >> 4 : p[i / 2] & 0xF; }

}  // namespace

SqmLinear read_sqm_linear(const ExportInput& in, const std::string& base) {
  const std::string wname = base + ".weight";
  if (!in.file->has(wname)) throw InputError(in.file->path() + ": tensor '" + wname + "' is missing");
  const SqmTensorInfo& wi = in.file->info(wname);
  if (wi.shape.size() != 2)
    throw InputError(in.file->path() + ": tensor '" + wname + "' has shape " + shape_to_string(wi.shape) + ", expected [out, in]");
  SqmLinear l;
  l.out = wi.shape[0];
  l.in = wi.shape[1];
  const std::string bname = base + ".bias";
  if (in.file->has(bname)) {
    expect(in, bname, {SqmDType::F32, SqmDType::F16, SqmDType::BF16}, {l.out});
    l.bias = widen(in, bname);
  }
  const SqmBytes raw = in.file->raw(wname);
  const size_t n = size_t(l.out * l.in);
  switch (wi.dtype) {
    case SqmDType::F32:
    case SqmDType::F16:
    case SqmDType::BF16:
      l.kind = SqmLinear::Kind::Float;
      l.weight = widen(in, wname);
      return l;
    case SqmDType::I8: {
      l.kind = SqmLinear::Kind::Int8;
      l.codes.assign(reinterpret_cast<const int8_t*>(raw.data), reinterpret_cast<const int8_t*>(raw.data) + n);
      const std::string sname = base + ".weight_scale";
      if (!in.file->has(sname)) throw InputError(in.file->path() + ": tensor '" + sname + "' is missing");
      const std::vector<int64_t> sshape = in.file->info(sname).shape;
      if (sshape != std::vector<int64_t>{l.out} && sshape != std::vector<int64_t>{1})
        throw InputError(in.file->path() + ": tensor '" + sname + "' has shape " + shape_to_string(sshape) + ", expected [" +
                         std::to_string(l.out) + "] or [1]");
      expect(in, sname, {SqmDType::F32}, sshape);
      const Tensor s = widen(in, sname);
      l.scale.assign(s.data(), s.data() + s.numel());
      const std::string iname = base + ".input_scale";
      if (in.file->has(iname)) {
        expect(in, iname, {SqmDType::F32}, {1});
        l.has_input_scale = true;
        l.input_scale = widen(in, iname).data()[0];
      }
      return l;
    }
    case SqmDType::I4x2:
    case SqmDType::U4x2: {
      if (in.scheme == "w4a4-atom")
        throw UnsupportedError(in.file->path() + ": '" + wname + "' is Atom W4A4 (reordered INT4 + outlier columns)");
      if (in.file->has(base + ".weight_superblock_scale"))
        throw UnsupportedError(in.file->path() + ": '" + wname + "' has K-quant scales (GGML's Q4_K: a float minimum per group, "
                               "which compressed-tensors' integer zero points cannot hold); export it with --format gguf");
      l.kind = SqmLinear::Kind::Int4;
      l.asym = wi.dtype == SqmDType::U4x2;
      if (!in.quant.contains("group_size") || !in.quant.at("group_size").is_number_integer() || in.quant.at("group_size").get<int64_t>() <= 0)
        throw InputError(in.file->path() + ": INT4 weights but the header has no positive integer quantization.group_size");
      l.group = in.quant.at("group_size").get<int64_t>();
      l.groups = (l.in + l.group - 1) / l.group;
      l.codes.resize(n);
      for (size_t i = 0; i < n; ++i) {
        const int v = nibble(raw.data, int64_t(i));
        l.codes[i] = int8_t(l.asym ? v : (v >= 8 ? v - 16 : v));
      }
      const std::string sname = base + ".weight_scale";
      expect(in, sname, {SqmDType::F16}, {l.out, l.groups});
      const Tensor s = widen(in, sname);
      l.scale.assign(s.data(), s.data() + s.numel());
      if (l.asym) {
        const std::string zname = base + ".weight_zero";
        expect(in, zname, {SqmDType::U4x2}, {l.out, l.groups});
        const SqmBytes z = in.file->raw(zname);
        l.zero.resize(size_t(l.out * l.groups));
        for (size_t i = 0; i < l.zero.size(); ++i) l.zero[i] = uint8_t(nibble(z.data, int64_t(i)));
      }
      return l;
    }
    default:
      throw InputError(in.file->path() + ": tensor '" + wname + "' has dtype " + sqm_dtype_name(wi.dtype) +
                       ", expected a float, I8, I4x2 or U4x2 weight");
  }
}

Tensor dequantize_sqm_linear(const SqmLinear& l) {
  if (l.kind == SqmLinear::Kind::Float) return l.weight;
  std::vector<float> w(size_t(l.out * l.in));
  for (int64_t r = 0; r < l.out; ++r)
    for (int64_t c = 0; c < l.in; ++c) {
      const size_t i = size_t(r * l.in + c);
      if (l.kind == SqmLinear::Kind::Int8) {
        w[i] = l.scale[l.scale.size() == 1 ? 0 : size_t(r)] * float(l.codes[i]);
      } else {
        const size_t g = size_t(r * l.groups + c / l.group);
        const int z = l.asym ? l.zero[g] : 0;
        w[i] = l.scale[g] * float(int(l.codes[i]) - z);
      }
    }
  return Tensor::from_vector({l.out, l.in}, std::move(w));
}

Tensor sqm_canonical_float(const ExportInput& in, const std::string& name) {
  if (!in.file->has(name)) return Tensor();
  const SqmTensorInfo& info = in.file->info(name);
  const std::string suffix = ".weight";
  if ((info.dtype == SqmDType::I8 || info.dtype == SqmDType::I4x2 || info.dtype == SqmDType::U4x2) && name.size() > suffix.size() &&
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return dequantize_sqm_linear(read_sqm_linear(in, name.substr(0, name.size() - suffix.size())));
  return widen(in, name);
}

SqmLinear stack_plan_linear(const ExportInput& in, const HfPlanEntry& e) {
  std::vector<SqmLinear> parts;
  std::vector<int64_t> rows;
  for (const std::string& s : e.sources) {
    parts.push_back(read_sqm_linear(in, s));
    rows.push_back(parts.back().out);
  }
  if (parts.size() == 1 && e.rows.empty() && in.config.rope_layout != RopeLayout::Interleaved && !e.zero_bias) return parts[0];
  const SqmLinear& p0 = parts[0];
  auto refuse = [&](const std::string& why) {
    std::string names;
    for (const auto& s : e.sources) names += (names.empty() ? "" : ", ") + s;
    throw UnsupportedError(in.file->path() + ": cannot fuse " + names + " into '" + e.name + "': " + why);
  };
  bool any_bias = e.zero_bias;
  for (const SqmLinear& p : parts) {
    if (p.kind != p0.kind) refuse("their weights are stored differently (float, INT8 or INT4)");
    if (p.in != p0.in) refuse("their input widths differ");
    if (p.kind == SqmLinear::Kind::Int4 && p.asym != p0.asym) refuse("symmetric and asymmetric INT4 mixed");
    if (p.kind == SqmLinear::Kind::Int8 && (p.scale.size() == 1) != (p0.scale.size() == 1)) refuse("per-tensor and per-channel scales mixed");
    if (p.kind == SqmLinear::Kind::Int8 && p.scale.size() == 1 && p.scale[0] != p0.scale[0])
      refuse("their per-tensor weight scales differ (" + std::to_string(p0.scale[0]) + " vs " + std::to_string(p.scale[0]) +
             "); one per-tensor scale cannot hold both");
    if (p.has_input_scale != p0.has_input_scale || (p.has_input_scale && p.input_scale != p0.input_scale))
      refuse("their static input scales differ; one input_scale cannot hold both");
    if (!p.bias.empty()) any_bias = true;
  }
  const std::vector<PlanRow> map = plan_row_map(in.config, e, rows);
  SqmLinear o;
  o.kind = p0.kind;
  o.in = p0.in;
  o.out = int64_t(map.size());
  o.group = p0.group;
  o.groups = p0.groups;
  o.asym = p0.asym;
  o.has_input_scale = p0.has_input_scale;
  o.input_scale = p0.input_scale;
  const bool per_row_scale = o.kind == SqmLinear::Kind::Int4 || (o.kind == SqmLinear::Kind::Int8 && p0.scale.size() != 1);
  const int64_t scale_w = o.kind == SqmLinear::Kind::Int4 ? o.groups : 1;
  std::vector<float> w, bias;
  for (const PlanRow& pr : map) {
    const SqmLinear& p = parts[size_t(pr.source)];
    if (o.kind == SqmLinear::Kind::Float) {
      w.insert(w.end(), p.weight.data() + pr.row * o.in, p.weight.data() + (pr.row + 1) * o.in);
    } else {
      o.codes.insert(o.codes.end(), p.codes.begin() + pr.row * o.in, p.codes.begin() + (pr.row + 1) * o.in);
      if (per_row_scale) o.scale.insert(o.scale.end(), p.scale.begin() + pr.row * scale_w, p.scale.begin() + (pr.row + 1) * scale_w);
      if (o.asym) o.zero.insert(o.zero.end(), p.zero.begin() + pr.row * o.groups, p.zero.begin() + (pr.row + 1) * o.groups);
    }
    if (any_bias) bias.push_back(p.bias.empty() ? 0.0f : p.bias.data()[pr.row]);
  }
  if (!per_row_scale && o.kind == SqmLinear::Kind::Int8) o.scale = p0.scale;
  if (o.kind == SqmLinear::Kind::Float) o.weight = Tensor::from_vector({o.out, o.in}, std::move(w));
  if (any_bias) o.bias = Tensor::from_vector({o.out}, std::move(bias));
  return o;
}

// ---- shared writers ----------------------------------------------------------------------------

void write_text_file(const std::string& path, const std::string& bytes) { write_file_atomic(path, bytes); }

void write_export_tokenizer(const ExportInput& in, const std::string& dir, ExportSummary& summary) {
  const nlohmann::json& h = in.file->header();
  if (!h.contains("tokenizer") || !h.at("tokenizer").is_object() || !h.at("tokenizer").contains("tensor")) {
    summary.notes.push_back("the .sqm has no embedded tokenizer; none written");
    return;
  }
  const std::string format = h.at("tokenizer").value("format", std::string());
  const std::string tensor = h.at("tokenizer").at("tensor").get<std::string>();
  if (!in.file->has(tensor)) throw InputError(in.file->path() + ": header names tokenizer tensor '" + tensor + "' but the file has none");
  std::string file;
  if (format == "hf-json") file = "tokenizer.json";
  else if (format == "sentencepiece") file = "tokenizer.model";
  else if (format == "gguf") file = "tokenizer.gguf";
  else {
    summary.notes.push_back("the embedded " + format + " tokenizer ('" + tensor +
                           "') has no Hugging Face form; no tokenizer written (tokenize with sqkit: sq-tokenize)");
    return;
  }
  const SqmBytes raw = in.file->raw(tensor);
  std::string bytes(reinterpret_cast<const char*>(raw.data), raw.size);
  if (file == "tokenizer.gguf") {
    // transformers' GGUF reader needs general.architecture, which the metadata-only tokenizer GGUF
    // of sq-convert does not carry: add the model's (first), keep every tokenizer key as it is.
    const GgufFile g(MappedFile::from_bytes(raw.data, raw.size, in.file->path() + ":" + tensor));
    if (!g.find("general.architecture")) {
      GgufValue arch;
      arch.type = GgufValueType::STRING;
      arch.str = in.config.architecture;
      std::vector<std::pair<std::string, const GgufValue*>> kvs = {{"general.architecture", &arch}};
      for (const auto& [k, v] : g.metadata()) kvs.emplace_back(k, &v);
      bytes = write_gguf_metadata(kvs);
    }
  }
  write_text_file(dir + "/" + file, bytes);
  summary.files.push_back(file);
  if (file == "tokenizer.gguf")
    summary.notes.push_back("tokenizer.gguf is the GGUF model's tokenizer metadata (no weights; general.architecture added); transformers reads it with "
                            "AutoTokenizer.from_pretrained(DIR, gguf_file=\"tokenizer.gguf\")");
}

std::string dropped_kv_cache_note(const ExportInput& in) {
  const nlohmann::json& h = in.file->header();
  if (!h.contains("kv_cache") || !h.at("kv_cache").is_object()) return "";
  const std::string f = h.at("kv_cache").value("format", std::string("fp32"));
  if (f == "fp32") return "";
  return "the .sqm's kv_cache format '" + f + "' (sqkit's per-token " + (f.rfind("nuq", 0) == 0 ? "non-uniform" : "uniform") +
         " KV quantization) has no serving-engine equivalent; dropped (use --kv fp8 for FP8 KV-cache scales)";
}

// ---- the hf format -----------------------------------------------------------------------------

namespace {

void check_hf(const ExportInput& in, const ExportOptions& o, ExportSummary&) {
  if (in.scheme == "w4a4-atom")
    throw UnsupportedError(in.file->path() + ": scheme w4a4-atom (Atom W4A4: reordered input channels, INT4 groups and outlier "
                           "columns) is not exported by --format hf");
  if (!o.kv.empty()) throw UsageError("--kv " + o.kv + " applies to --format compressed-tensors only");
  refuse_online_rotation(in.quant, in.file->path(), "hf");  // a plain checkpoint has no online transform
  hf_write_plan(in.config);  // UnsupportedError for an architecture without a plan
  ModelConfig written = in.config;
  written.rope_layout = RopeLayout::HalfSplit;
  make_hf_config_json(written, "float32");
}

void write_hf(const ExportInput& in, const ExportOptions&, const std::string& dir, ExportSummary& s) {
  ModelConfig written = in.config;
  written.rope_layout = RopeLayout::HalfSplit;
  const nlohmann::ordered_json config = make_hf_config_json(written, "float32");
  std::vector<SafetensorsOutput> outputs;
  const auto lookup = [&](const std::string& name) { return sqm_canonical_float(in, name); };
  for (auto& [name, t] : plan_float_tensors(in.config, hf_write_plan(in.config), lookup, in.file->path()))
    outputs.push_back({name, "F32", t, {}, nullptr});
  write_safetensors(dir + "/model.safetensors", outputs, {{"format", "pt"}});
  s.tensors = int64_t(outputs.size());
  write_text_file(dir + "/config.json", config.dump(2) + "\n");
  s.files.push_back("model.safetensors");
  s.files.push_back("config.json");
  if (const std::string note = dropped_kv_cache_note(in); !note.empty()) s.notes.push_back(note);
  write_export_tokenizer(in, dir, s);
}

}  // namespace

const std::vector<ExportFormat>& export_formats() {
  static const std::vector<ExportFormat> formats = {
      {"compressed-tensors", "Hugging Face directory in compressed-tensors format (W8A8 int-quantized, W4A16 pack-quantized)",
       check_compressed_tensors_export, write_compressed_tensors_export},
      {"hf", "plain FP32 Hugging Face directory of the dequantized weights (as sqkit's runner uses them)", check_hf, write_hf},
  };
  return formats;
}

// ---- driver ------------------------------------------------------------------------------------

namespace {

/// Refuses an output location that exists (without force), is not a directory, is or contains
/// an input, or whose parent is missing or not writable.
void check_output_location(const std::string& out, bool force, const std::vector<std::string>& inputs) {
  if (out.empty()) throw UsageError("-o: empty directory name");
  std::error_code ec;
  const fs::path abs_out = fs::weakly_canonical(fs::absolute(out), ec);
  for (const std::string& in : inputs) {
    if (in.empty()) continue;
    const fs::path abs_in = fs::weakly_canonical(fs::absolute(in), ec);
    auto rel = abs_in.lexically_relative(abs_out);
    if (abs_in == abs_out || (!rel.empty() && rel.native().rfind("..", 0) != 0))
      throw UsageError("-o " + out + " is or contains the input " + in + "; refusing to overwrite it");
  }
  const fs::file_status st = fs::symlink_status(out, ec);
  if (fs::exists(st)) {
    if (!force) throw UsageError("-o " + out + " already exists (use --force to replace it)");
    if (!fs::is_directory(fs::status(out, ec))) throw UsageError("-o " + out + " exists and is not a directory");
  }
  const fs::path parent = fs::path(out).has_parent_path() ? fs::path(out).parent_path() : fs::path(".");
  check_parent_directory("-o", out, parent);
}

/// A temporary directory beside the output (create_temp_dir_beside(), formats/atomic_file.h),
/// registered with the interrupt handlers from before it exists until it is committed, so that a
/// SIGINT/SIGTERM removes it with the files in it; removed with its files unless committed.
class TempDir {
 public:
  explicit TempDir(const std::string& out) : tmp_(create_temp_dir_beside(out)) {
    const mode_t mask = ::umask(0);  // mkdir applied the umask already; keep it as it was
    ::umask(mask);
    ::chmod(tmp_.path.c_str(), 0777 & ~mask);
  }
  ~TempDir() {
    if (!tmp_.path.empty()) {
      std::error_code ec;
      fs::remove_all(tmp_.path, ec);
    }
    unregister_temp_file(tmp_.slot);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return tmp_.path; }
  /// Moves the directory to `out` (commit_temp_dir: an `out` that another writer created meanwhile
  /// is replaced only when `force`, else OutputError) and forgets it.
  void commit(const std::string& out, bool force) {
    commit_temp_dir(tmp_.path, out, force);
    unregister_temp_file(tmp_.slot);  // after the rename: an interrupt before it removes the directory
    tmp_.slot = -1;
    tmp_.path.clear();
  }

 private:
  TempDirBeside tmp_;
};

}  // namespace

ExportSummary export_sqm(const std::string& sqm_path, const std::string& out_dir, const ExportOptions& o) {
  const ExportFormat* format = nullptr;
  std::string names;
  for (const auto& f : export_formats()) {
    names += (names.empty() ? "" : ", ") + std::string(f.name);
    if (o.format == f.name) format = &f;
  }
  if (!format) throw UsageError("--format '" + o.format + "' is not supported (expected one of " + names + ")");
  if (!o.kv.empty() && o.kv != "fp8") throw UsageError("--kv '" + o.kv + "' is not supported (expected fp8)");
  if (!o.kv.empty() && o.calibration.empty()) throw UsageError("--kv fp8 needs --calibration (the sq-calibrate file with K/V statistics)");
  if (o.kv.empty() && !o.calibration.empty()) throw UsageError("--calibration applies to --kv fp8 only");
  check_output_location(out_dir, o.force, {sqm_path, o.calibration});
  if (!looks_like_sqm(sqm_path)) {
    std::error_code ec;
    if (!fs::exists(sqm_path, ec)) throw InputError("cannot open " + sqm_path + ": no such file");
    throw InputError(sqm_path + ": not an sqkit .sqm file");
  }
  ExportInput in;
  in.file = SqmFile::open(sqm_path);
  const nlohmann::json& h = in.file->header();
  in.config = model_config_from_json(h.contains("model_config") ? h.at("model_config") : nlohmann::json(), sqm_path);
  in.quant = h.contains("quantization") && h.at("quantization").is_object() ? h.at("quantization") : nlohmann::json::object();
  in.scheme = in.quant.value("scheme", std::string("f32"));
  ExportSummary s;
  s.format = o.format;
  s.scheme = in.scheme;
  s.output = out_dir;
  format->check(in, o, s);  // refusals before anything is written
  TempDir tmp(out_dir);
  format->write(in, o, tmp.path(), s);
  std::sort(s.files.begin(), s.files.end());
  std::error_code ec;
  s.safetensors_bytes = fs::file_size(tmp.path() + "/model.safetensors", ec);
  if (ec) s.safetensors_bytes = 0;
  tmp.commit(out_dir, o.force);
  return s;
}

}  // namespace sq
