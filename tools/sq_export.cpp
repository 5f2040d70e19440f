// sq-export: write a .sqm model as a Hugging Face checkpoint directory — compressed-tensors
// (W8A8 int-quantized, W4A16 pack-quantized, FP8 KV-cache scales) or a plain FP32 checkpoint of
// the dequantized weights (formats/export/sqm_export.h, docs/formats.md "Exports (sq-export)") —
// or as one GGUF file for llama.cpp (formats/gguf_export.h, docs/formats.md "GGUF export").
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "core/tool_main.h"
#include "formats/export/sqm_export.h"
#include "formats/gguf_export.h"
#include "tool_cli.h"

int main(int argc, char** argv) {
  std::string formats;
  for (const auto& f : sq::export_formats()) formats += std::string(formats.empty() ? "" : " | ") + f.name;
  formats += " | gguf";
  CLI::App app{"sq-export: write a .sqm model as a Hugging Face checkpoint directory (config.json, model.safetensors, tokenizer) "
               "or a GGUF file.\n"
               "Formats: compressed-tensors (W8A8 int-quantized, W4A16 pack-quantized; loads in transformers / vLLM), hf "
               "(plain FP32 of the weights dequantized exactly as sqkit runs them), gguf (llama.cpp: symmetric INT4 g32k -> Q4_0, "
               "asymmetric -> Q4_1, INT8 -> Q8_0; architectures llama, qwen2, gemma3).\n"
               "Exit status: 0 written; 2 bad input or a model the format cannot hold (nothing written); 1 other failures."};
  std::string model_path, out_dir, json_path, outtype = "auto";
  sq::ExportOptions o;
  app.add_option("model", model_path, "The .sqm model (from sq-convert)")->required();
  app.add_option("--format", o.format, formats)->required();
  app.add_option("-o,--output", out_dir, "Output directory (--format gguf: the .gguf file); written beside it and renamed into place at the end")->required();
  app.add_flag("--force", o.force, "Replace an existing output directory (only once the export succeeded)");
  app.add_option("--kv", o.kv, "compressed-tensors: fp8 = per-tensor FP8 KV-cache scales (k_scale / v_scale) from --calibration");
  app.add_option("--calibration", o.calibration, "sq-calibrate file whose K/V statistics give the --kv fp8 scales");
  app.add_option("--outtype", outtype, "gguf: auto = each tensor in the GGUF type that holds it exactly (Q4_0 / Q4_1 / Q8_0 / F32...); "
                                       "f32 = every weight dequantized to F32 as sqkit's runner uses it")
      ->capture_default_str();
  sq::add_json_option(app, json_path, "A summary of what was written");
  sq::add_version_flag(app, "sq-export");
  if (const int status = sq::parse_tool_args(app, "sq-export", argc, argv); status >= 0) return status;
  return sq::run_tool("sq-export", [&]() {
    if (!json_path.empty() && json_path != "-") sq::check_output_path("--json", json_path, true, {model_path, o.calibration});
    bool known = o.format == "gguf";
    std::string names;
    for (const auto& f : sq::export_formats()) {
      names += std::string(f.name) + ", ";
      known = known || o.format == f.name;
    }
    if (!known) throw sq::UsageError("--format '" + o.format + "' is not supported (expected one of " + names + "gguf)");
    if (outtype != "auto" && outtype != "f32") throw sq::UsageError("--outtype '" + outtype + "' is not supported (expected auto or f32)");
    if (o.format == "gguf") {
      if (!o.kv.empty() || !o.calibration.empty()) throw sq::UsageError("--kv / --calibration apply to --format compressed-tensors only");
      sq::check_output_path("-o", out_dir, o.force, {model_path});
      sq::StdoutToStderr redirect(json_path == "-");
      const sq::GgufExportReport r = sq::export_gguf(model_path, out_dir, {.force = o.force, .dequantize = outtype == "f32"});
      for (const std::string& w : r.warnings) std::fprintf(stderr, "sq-export: warning: %s\n", w.c_str());
      redirect.restore();
      if (!json_path.empty()) {
        nlohmann::ordered_json j;
        j["input"] = model_path;
        j["output"] = out_dir;
        j["format"] = "gguf";
        j["gguf"] = r.to_json();
        sq::write_json_report(json_path, j);
      }
      if (json_path != "-")
        std::printf("sq-export: %s -> %s (gguf %s, file type %s, %lld tensors, %.2f MiB, largest FP16 scale rounding %.3g)\n",
                    model_path.c_str(), out_dir.c_str(), r.architecture.c_str(), r.file_type.c_str(), static_cast<long long>(r.tensors),
                    static_cast<double>(r.bytes) / (1 << 20), r.max_scale_rounding_rel);
      return sq::kExitOk;
    }
    if (outtype != "auto") throw sq::UsageError("--outtype applies to --format gguf only");
    sq::StdoutToStderr redirect(json_path == "-");
    const sq::ExportSummary s = sq::export_sqm(model_path, out_dir, o);
    for (const std::string& n : s.notes) std::fprintf(stderr, "sq-export: note: %s\n", n.c_str());
    redirect.restore();
    if (!json_path.empty()) {
      nlohmann::ordered_json j;
      j["input"] = model_path;
      j["output"] = s.output;
      j["format"] = s.format;
      j["scheme"] = s.scheme;
      j["files"] = s.files;
      j["tensors"] = s.tensors;
      j["safetensors_bytes"] = s.safetensors_bytes;
      j["notes"] = s.notes;
      j["quantization_config"] = s.quantization_config;
      sq::write_json_report(json_path, j);
    }
    if (json_path != "-")
      std::printf("sq-export: %s -> %s (%s, scheme %s, %lld tensors, %.2f MiB)\n", model_path.c_str(), out_dir.c_str(), s.format.c_str(),
                  s.scheme.c_str(), static_cast<long long>(s.tensors), static_cast<double>(s.safetensors_bytes) / (1 << 20));
    return sq::kExitOk;
  });
}
