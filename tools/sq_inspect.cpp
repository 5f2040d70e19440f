// sq-inspect: summary of a packed model file (.sqm): producer, model config, tokenizer, quantization
// recipe, calibration provenance, tensor bytes by dtype and bits per weight (docs/formats.md); or of
// a GGUF file: version, metadata, tokenizer, bytes by ggml type and bits per weight
// (formats/gguf_summary.h).
//
// Bits per weight = 8 x (raw bytes of every tensor whose name does not start with "tokenizer")
//                     / (logical elements of every tensor whose name ends with ".weight" or ".weight_outlier").
// The numerator counts everything the model needs besides its tokenizer (quantized weights, scales,
// zero points, codebooks, norms, biases, reorders); the denominator counts logical weight elements (an
// I4x2 tensor of shape [n, k] counts n*k; Atom W4A4 keeps a linear's outlier input columns in a
// separate "*.weight_outlier" tensor, counted too). Raw (uncompressed) bytes are used, so the figure does not
// depend on --compress. "n/a" when no tensor is named *.weight.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "core/tool_main.h"
#include "formats/gguf_checkpoint.h"
#include "formats/gguf_file.h"
#include "formats/gguf_summary.h"
#include "formats/sqm_file.h"
#include "tool_cli.h"

namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

/// A JSON value for display: strings without quotes, everything else compact JSON.
std::string show(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Prints "label:" and then the object's members as indented "key  value" lines (or the value on
/// the same line when it is not an object).
void print_section(const char* label, const nlohmann::json& v) {
  if (!v.is_object()) {
    std::printf("%-15s %s\n", (std::string(label) + ":").c_str(), show(v).c_str());
    return;
  }
  std::printf("%s:%s\n", label, v.empty() ? " {}" : "");
  size_t width = 0;
  for (const auto& [k, _] : v.items()) width = std::max(width, k.size());
  for (const auto& [k, val] : v.items())
    std::printf("  %-*s  %s\n", static_cast<int>(width), k.c_str(), show(val).c_str());
}

struct DtypeTotals {
  int64_t tensors = 0;
  uint64_t raw_bytes = 0;
  uint64_t stored_bytes = 0;
};

/// Prints a GGUF summary (formats/gguf_summary.h) as text.
void print_gguf(const std::string& path, const nlohmann::json& j, bool list_tensors) {
  std::printf("%-15s %s\n", "file:", path.c_str());
  std::printf("%-15s GGUF version %s, %s bytes, alignment %s\n", "format:", show(j["gguf_version"]).c_str(),
              show(j["file_bytes"]).c_str(), show(j["alignment"]).c_str());
  std::printf("%-15s %s\n", "architecture:", j["architecture"].is_null() ? "(not recorded)" : show(j["architecture"]).c_str());
  if (!j["name"].is_null()) std::printf("%-15s %s\n", "name:", show(j["name"]).c_str());
  if (j["tokenizer"].is_null()) std::printf("%-15s %s\n", "tokenizer:", "(none: no tokenizer.ggml.model)");
  else print_section("tokenizer", j["tokenizer"]);
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [k, v] : j["metadata"].items())
    if (!starts_with(k, "tokenizer.")) meta[k] = v;
  print_section("metadata", meta);
  std::printf("%-15s %s\n", "tensors:", show(j["tensor_count"]).c_str());
  std::printf("bytes by type:\n");
  for (const auto& [name, d] : j["bytes_by_type"].items())
    std::printf("  %-5s %s bytes in %s tensor%s (%s elements)\n", name.c_str(), show(d["bytes"]).c_str(),
                show(d["tensors"]).c_str(), d["tensors"].get<int64_t>() == 1 ? "" : "s", show(d["elements"]).c_str());
  if (j["bits_per_weight"].is_null())
    std::printf("%-15s n/a (no tensor named *.weight)\n", "bits/weight:");
  else
    std::printf("%-15s %.4f (8 x %s tensor bytes / %s elements of *.weight tensors)\n", "bits/weight:",
                j["bits_per_weight"].get<double>(), show(j["tensor_bytes"]).c_str(), show(j["weight_elements"]).c_str());
  if (!list_tensors) return;
  size_t wn = 4, ws = 5;
  for (const auto& t : j["tensors"]) {
    wn = std::max(wn, t["name"].get<std::string>().size());
    ws = std::max(ws, shape_str(t["shape"].get<std::vector<int64_t>>()).size());
  }
  std::printf("\n%-*s  %-5s  %-*s  %12s\n", static_cast<int>(wn), "NAME", "TYPE", static_cast<int>(ws), "SHAPE", "BYTES");
  for (const auto& t : j["tensors"])
    std::printf("%-*s  %-5s  %-*s  %12s\n", static_cast<int>(wn), t["name"].get<std::string>().c_str(),
                t["type"].get<std::string>().c_str(), static_cast<int>(ws),
                shape_str(t["shape"].get<std::vector<int64_t>>()).c_str(), show(t["bytes"]).c_str());
}

/// Refuses, before parsing, an input that is not a .sqm file with a line saying what sq-inspect
/// accepts: a Hugging Face checkpoint directory, anything else without the .sqm magic.
void check_inspectable(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string accepts = "sq-inspect reads packed .sqm files written by sq-convert and GGUF files";
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const bool hf = fs::exists(fs::path(path) / "config.json", ec);
    throw sq::UsageError(path + " is a directory" + (hf ? " (a Hugging Face checkpoint)" : "") + "; " + accepts +
                         " (convert it first: sq-convert -m " + path + " --scheme f32 -o model.sqm)");
  }
  if (!std::ifstream(path, std::ios::binary)) return;  // SqmFile::open names the file and the system error
  if (!sq::looks_like_sqm(path))
    throw sq::UsageError(path + " is not an sqkit .sqm file; " + accepts +
                         " (llama2.c .bin files and Hugging Face directories are converted with sq-convert)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sq-inspect: summarize a packed model file (.sqm): producer, model config, quantization recipe, "
               "calibration provenance, bytes by dtype and bits per weight (docs/formats.md); or a GGUF file: version, "
               "metadata, tokenizer, bytes by ggml type and bits per weight."};
  std::string path, json_path;
  bool list_tensors = false, no_verify = false, force = false;
  app.add_option("file", path, "The .sqm or .gguf file")->required();
  sq::add_json_option(app, json_path, "The summary (instead of the text)");
  app.add_flag("--force", force, "Replace an existing --json file");
  app.add_flag("--tensors", list_tensors, "List every tensor (name, dtype, shape, bytes, compression)");
  app.add_flag("--no-verify", no_verify, "Skip the per-tensor checksum verification of a .sqm file (faster on big files; GGUF has no checksums)");
  sq::add_version_flag(app, "sq-inspect");
  if (const int status = sq::parse_tool_args(app, "sq-inspect", argc, argv); status >= 0) return status;

  return sq::run_tool("sq-inspect", [&]() {
    const bool json = !json_path.empty();
    if (json) sq::check_output_path("--json", json_path, force, {path}, true);
    if (sq::looks_like_gguf(path)) {  // the GGUF magic, or *.gguf (the reader then names what is wrong)
      const nlohmann::json j = sq::gguf_summary(sq::GgufFile(path), list_tensors);
      if (json) sq::write_json_report(json_path, j);
      else print_gguf(path, j, list_tensors);
      return sq::kExitOk;
    }
    check_inspectable(path);
    const auto file = sq::SqmFile::open(path, !no_verify);
    const nlohmann::json& header = file->header();

    std::map<std::string, DtypeTotals> by_dtype;
    uint64_t total_raw = 0, total_stored = 0, weight_bytes = 0, weight_elements = 0;
    int64_t compressed = 0;
    for (const auto& t : file->tensors()) {
      auto& d = by_dtype[sq::sqm_dtype_name(t.dtype)];
      d.tensors += 1;
      d.raw_bytes += t.raw_bytes;
      d.stored_bytes += t.stored_bytes;
      total_raw += t.raw_bytes;
      total_stored += t.stored_bytes;
      compressed += t.compressed ? 1 : 0;
      if (!starts_with(t.name, "tokenizer")) weight_bytes += t.raw_bytes;
      if (ends_with(t.name, ".weight") || ends_with(t.name, ".weight_outlier")) weight_elements += t.numel();
    }
    // Quantized linears only (INT8/INT4 *.weight with their *.weight_scale / *.weight_zero /
    // *.input_scale companions, and for Atom W4A4 *.weight_outlier (elements counted as weights),
    // *.weight_outlier_scale and *.act_clip): the storage cost of the packed layout itself.
    uint64_t qlin_bytes = 0, qlin_elements = 0;
    for (const auto& t : file->tensors()) {
      if (!ends_with(t.name, ".weight")) continue;
      if (t.dtype != sq::SqmDType::I8 && t.dtype != sq::SqmDType::I4x2 && t.dtype != sq::SqmDType::U4x2) continue;
      const std::string base = t.name.substr(0, t.name.size() - 7);
      qlin_bytes += t.raw_bytes;
      qlin_elements += t.numel();
      for (const char* companion : {".weight_scale", ".weight_zero", ".input_scale", ".weight_outlier", ".weight_outlier_scale", ".act_clip"})
        if (file->has(base + companion)) qlin_bytes += file->info(base + companion).raw_bytes;
      if (file->has(base + ".weight_outlier")) qlin_elements += file->info(base + ".weight_outlier").numel();
    }
    const double qlin_bpw = qlin_elements ? 8.0 * static_cast<double>(qlin_bytes) / static_cast<double>(qlin_elements) : 0.0;
    const bool has_bpw = weight_elements > 0;
    const double bpw = has_bpw ? 8.0 * static_cast<double>(weight_bytes) / static_cast<double>(weight_elements) : 0.0;

    if (json) {
      nlohmann::json j;
      j["file"] = path;
      j["file_bytes"] = file->file_size();
      j["format_version"] = file->version();
      j["header"] = header;
      j["tensor_count"] = file->tensors().size();
      j["compressed_tensor_count"] = compressed;
      nlohmann::json bd = nlohmann::json::object();
      for (const auto& [name, d] : by_dtype)
        bd[name] = {{"tensors", d.tensors}, {"raw_bytes", d.raw_bytes}, {"stored_bytes", d.stored_bytes}};
      j["bytes_by_dtype"] = bd;
      j["total_raw_bytes"] = total_raw;
      j["total_stored_bytes"] = total_stored;
      j["weight_bytes"] = weight_bytes;
      j["weight_elements"] = weight_elements;
      j["bits_per_weight"] = has_bpw ? nlohmann::json(bpw) : nlohmann::json(nullptr);
      j["quantized_linear_bytes"] = qlin_bytes;
      j["quantized_linear_elements"] = qlin_elements;
      j["quantized_linear_bits_per_weight"] = qlin_elements ? nlohmann::json(qlin_bpw) : nlohmann::json(nullptr);
      if (list_tensors) {
        nlohmann::json arr = nlohmann::json::array();
        for (const auto& t : file->tensors())
          arr.push_back({{"name", t.name},
                         {"dtype", sq::sqm_dtype_name(t.dtype)},
                         {"shape", t.shape},
                         {"offset", t.offset},
                         {"raw_bytes", t.raw_bytes},
                         {"stored_bytes", t.stored_bytes},
                         {"compression", t.compression()}});
        j["tensors"] = arr;
      }
      sq::write_json_report(json_path, j);
      return sq::kExitOk;
    }

    std::printf("%-15s %s\n", "file:", path.c_str());
    std::printf("%-15s .sqm version %u, %llu bytes\n", "format:", file->version(),
                static_cast<unsigned long long>(file->file_size()));
    std::printf("%-15s %s\n", "producer:", header.contains("producer") ? show(header["producer"]).c_str() : "(not recorded)");
    for (const char* key : {"model_config", "tokenizer", "quantization", "kv_cache", "calibration"}) {
      if (header.contains(key)) print_section(key, header[key]);
      else if (std::string(key) == "quantization") std::printf("%-15s %s\n", "quantization:", "(none recorded)");
      else if (std::string(key) == "model_config") std::printf("%-15s %s\n", "model_config:", "(not recorded)");
    }
    std::string others;
    for (const auto& [k, _] : header.items())
      if (k != "format" && k != "producer" && k != "model_config" && k != "tokenizer" && k != "quantization" &&
          k != "calibration" && k != "kv_cache")
        others += (others.empty() ? "" : ", ") + k;
    if (!others.empty()) std::printf("%-15s %s\n", "other keys:", others.c_str());
    std::printf("%-15s %zu (%lld zstd-compressed)\n", "tensors:", file->tensors().size(), static_cast<long long>(compressed));
    std::printf("bytes by dtype:\n");
    for (const auto& [name, d] : by_dtype) {
      std::printf("  %-5s %llu bytes in %lld tensor%s", name.c_str(), static_cast<unsigned long long>(d.raw_bytes),
                  static_cast<long long>(d.tensors), d.tensors == 1 ? "" : "s");
      if (d.stored_bytes != d.raw_bytes) std::printf(" (%llu stored)", static_cast<unsigned long long>(d.stored_bytes));
      std::printf("\n");
    }
    std::printf("%-15s %llu raw, %llu stored\n", "total bytes:", static_cast<unsigned long long>(total_raw),
                static_cast<unsigned long long>(total_stored));
    if (has_bpw)
      std::printf("%-15s %.4f (8 x %llu non-tokenizer bytes / %llu elements of *.weight tensors)\n", "bits/weight:", bpw,
                  static_cast<unsigned long long>(weight_bytes), static_cast<unsigned long long>(weight_elements));
    else
      std::printf("%-15s n/a (no tensor named *.weight)\n", "bits/weight:");
    if (qlin_elements)
      std::printf("%-15s %.4f (8 x %llu bytes of quantized weights + scales/zero points/outliers / %llu weights)\n", "linear bits/w:",
                  qlin_bpw, static_cast<unsigned long long>(qlin_bytes), static_cast<unsigned long long>(qlin_elements));

    if (list_tensors) {
      size_t wn = 4, ws = 5;
      for (const auto& t : file->tensors()) {
        wn = std::max(wn, t.name.size());
        ws = std::max(ws, shape_str(t.shape).size());
      }
      std::printf("\n%-*s  %-5s  %-*s  %12s  %s\n", static_cast<int>(wn), "NAME", "DTYPE", static_cast<int>(ws), "SHAPE",
                  "BYTES", "COMPRESSION");
      for (const auto& t : file->tensors()) {
        std::printf("%-*s  %-5s  %-*s  %12llu  %s", static_cast<int>(wn), t.name.c_str(), sq::sqm_dtype_name(t.dtype),
                    static_cast<int>(ws), shape_str(t.shape).c_str(), static_cast<unsigned long long>(t.stored_bytes),
                    t.compression());
        if (t.compressed) std::printf(" (%llu raw)", static_cast<unsigned long long>(t.raw_bytes));
        std::printf("\n");
      }
    }
    return sq::kExitOk;
  });
}
