#include "formats/export/compressed_tensors_export.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "formats/calibration_h5.h"
#include "formats/hf_config.h"
#include "formats/hf_plan.h"
#include "formats/rotation_header.h"
#include "formats/safetensors.h"
#include "model/decoder_linears.h"
#include "quant/int8_quantize.h"

namespace sq {

std::vector<int32_t> pack_int_rows(const std::vector<int8_t>& codes, int64_t rows, int64_t cols, int bits) {
  const int64_t per_word = 32 / bits;
  const int64_t words = (cols + per_word - 1) / per_word;
  const uint32_t offset = 1u << (bits - 1), mask = (1u << bits) - 1;
  std::vector<int32_t> out(size_t(rows * words), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint32_t v = (uint32_t(int32_t(codes[size_t(r * cols + c)])) + offset) & mask;
      uint32_t& w = reinterpret_cast<uint32_t&>(out[size_t(r * words + c / per_word)]);
      w |= v << (bits * (c % per_word));
    }
  return out;
}

std::vector<int32_t> pack_int4_cols(const std::vector<int8_t>& zp, int64_t rows, int64_t cols) {
  const int64_t words = (rows + 7) / 8;
  std::vector<int32_t> out(size_t(words * cols), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const uint32_t v = uint32_t(zp[size_t(r * cols + j)] + 8) & 0xF;
      uint32_t& w = reinterpret_cast<uint32_t&>(out[size_t((r / 8) * cols + j)]);
      w |= v << (4 * (r % 8));
    }
  return out;
}

namespace {

bool quantized_scheme(const std::string& s) { return s == "w8a8" || s == "w4a16"; }
bool float_scheme(const std::string& s) { return s == "f32" || s == "f16" || s == "bf16"; }

/// Whether `base`.weight exists as INT8 or INT4 codes.
bool is_quantized_weight(const ExportInput& in, const std::string& base) {
  const std::string w = base + ".weight";
  if (!in.file->has(w)) return false;
  const SqmDType d = in.file->info(w).dtype;
  return d == SqmDType::I8 || d == SqmDType::I4x2 || d == SqmDType::U4x2;
}

/// The config (tied embeddings undone when the tied head is the quantized (INT8 or INT4) embedding:
/// compressed-tensors quantizes lm_head as its own Linear) and its plan, lm_head then reading
/// model.embed_tokens.
struct Plan {
  ModelConfig config;  ///< as written (half-split, maybe untied)
  std::vector<HfPlanEntry> entries;
};

Plan make_plan(const ExportInput& in) {
  Plan p;
  p.config = in.config;
  const bool head_is_embed = in.config.tied_embeddings && !in.file->has("lm_head.weight") && is_quantized_weight(in, "model.embed_tokens");
  if (head_is_embed) p.config.tied_embeddings = false;
  p.entries = hf_write_plan(p.config);
  if (head_is_embed)
    for (auto& e : p.entries)
      if (e.linear && e.sources == std::vector<std::string>{"lm_head"}) e.sources = {"model.embed_tokens"};
  return p;
}

/// compressed-tensors' transform_config for a file with online Hadamard rotations
/// (quantization.rotation, formats/rotation_header.h), null without them: one "hadamard" scheme per
/// rotated activation site, applied online at the input of every module reading that site (the
/// exported weights already hold W·R), with head_dim = the site's block, so the transform is
/// block-diagonal with blocks of Sylvester's Walsh–Hadamard matrix scaled by 1/√block — exactly the
/// runner's R (lib/ops/hadamard.h; compressed-tensors' HadamardFactory, deterministic_hadamard_matrix
/// and apply_transform_weight). The per-head v/o rotation is folded into the weights and needs
/// nothing. Throws UnsupportedError naming the file when a module reads two rotated sites or a
/// rotated site has no module in the plan.
nlohmann::ordered_json transform_config(const ExportInput& in, const Plan& p) {
  const RotationHeader r = rotation_from_quantization(in.quant, in.file->path());
  if (r.online.empty()) return nullptr;
  std::map<std::string, std::string> site_of;  // sqkit linear base name -> activation site name
  for (int l = 0; l < in.config.n_layers; ++l)
    for (const LinearSlot& slot : decoder_layer_linears(in.config, l)) site_of[slot.name] = activation_site_name(slot.site);
  std::map<std::string, std::vector<std::string>> targets;  // site -> module names
  for (const HfPlanEntry& e : p.entries) {
    if (!e.linear) continue;
    std::string site;
    for (const std::string& src : e.sources) {
      const auto it = site_of.find(src);
      if (it == site_of.end()) continue;
      if (!site.empty() && site != it->second)
        throw UnsupportedError(in.file->path() + ": the module '" + e.name + "' reads both the " + site + " and the " + it->second +
                               " activations, which are rotated differently: no transform_config can express it");
      site = it->second;
    }
    if (!site.empty() && r.online.count(site)) targets[site].push_back(e.name);
  }
  nlohmann::ordered_json groups = nlohmann::ordered_json::object();
  for (const auto& [site, block] : r.online) {
    if (targets[site].empty())
      throw UnsupportedError(in.file->path() + ": no module of the export reads the rotated " + site + " activation");
    nlohmann::ordered_json apply;
    apply["targets"] = targets[site];
    apply["location"] = "input";
    apply["inverse"] = false;
    apply["ignore"] = nlohmann::ordered_json::array();
    nlohmann::ordered_json scheme;
    scheme["type"] = "hadamard";
    scheme["apply"] = nlohmann::ordered_json::array({apply});
    scheme["randomize"] = false;
    scheme["requires_grad"] = false;
    scheme["head_dim"] = block;
    groups[site] = scheme;
  }
  return {{"config_groups", groups}};
}


/// Symmetric 8-bit weight arguments with `strategy` "channel" or "tensor".
nlohmann::ordered_json int8_weights_args(const char* strategy) {
  return {{"num_bits", 8}, {"type", "int"}, {"symmetric", true}, {"group_size", nullptr}, {"strategy", strategy}, {"dynamic", false}};
}

nlohmann::ordered_json weights_args(const ExportInput& in) {
  nlohmann::ordered_json w;
  if (in.scheme == "w8a8") {
    const std::string g = in.quant.value("weight", std::string("per-channel"));
    w = int8_weights_args(g == "per-tensor" ? "tensor" : "channel");
  } else {
    w = {{"num_bits", 4}, {"type", "int"}, {"symmetric", in.quant.value("symmetric", true)}, {"group_size", in.quant.value("group_size", 128)},
         {"strategy", "group"}, {"dynamic", false}};
    const bool act_order = in.quant.contains("gptq") && in.quant.at("gptq").is_object() && in.quant.at("gptq").value("act_order", false);
    // sqkit's GPTQ act-order keeps static groups (contiguous column ranges): compressed-tensors'
    // "static" (alias of "weight") ordering, which needs no g_idx.
    if (act_order) w["actorder"] = "static";
  }
  return w;
}

nlohmann::ordered_json input_args(const ExportInput& in) {
  if (in.scheme != "w8a8") return nullptr;
  const std::string a = in.quant.value("act", std::string("per-token"));
  // per-token-group: compressed-tensors' dynamic GROUP strategy along the input (group_size 32),
  // which its QuantizationArgs accept; vLLM's INT8 W8A8 kernels take per-token or per-tensor
  // activation scales only (docs/formats.md), so such an export is for transformers.
  if (a == "per-token-group")
    return {{"num_bits", 8}, {"type", "int"}, {"symmetric", true}, {"group_size", kActGroupSize}, {"strategy", "group"}, {"dynamic", true}};
  const bool token = a == "per-token", dynamic = a != "per-tensor-static";
  return {{"num_bits", 8}, {"type", "int"}, {"symmetric", true}, {"group_size", nullptr}, {"strategy", token ? "token" : "tensor"},
          {"dynamic", dynamic}};
}

}  // namespace

void calibration_kv_scales(const ExportInput& in, const std::string& path, std::vector<float>& k_scale, std::vector<float>& v_scale) {
  const nlohmann::json smoothing = in.quant.value("smoothing", nlohmann::json::object());
  if (smoothing.is_object() && smoothing.value("smooth_vo", false))
    throw UnsupportedError(in.file->path() + ": --kv fp8 with a model smoothed v -> o (--smooth-vo): the calibration file's values are "
                           "those of the unsmoothed v_proj");
  const CalibrationData cal = read_calibration_h5(path, CalibrationHessians::Defer);  // K/V statistics only
  const ModelConfig& c = in.config;
  const nlohmann::json& h = in.file->header();
  if (h.contains("source") && h.at("source").is_object() && h.at("source").contains("fingerprint") &&
      h.at("source").at("fingerprint").is_string() && !cal.provenance.model_fingerprint.empty() &&
      h.at("source").at("fingerprint").get<std::string>() != cal.provenance.model_fingerprint)
    throw InputError(path + " was recorded for another model (fingerprint " + cal.provenance.model_fingerprint.substr(0, 12) + ", " +
                     in.file->path() + " was converted from " + h.at("source").at("fingerprint").get<std::string>().substr(0, 12) + ")");
  const int64_t kvw = int64_t(c.n_kv_heads) * c.head_dim;
  if (int64_t(cal.layers.size()) != c.n_layers)
    throw InputError(path + " has " + std::to_string(cal.layers.size()) + " layers, the model " + std::to_string(c.n_layers));
  const bool rope = c.spec.position == PositionKind::Rope;
  const int rd = rope ? (c.spec.rope_dim > 0 ? c.spec.rope_dim : c.head_dim) : 0;
  k_scale.clear();
  v_scale.clear();
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerStats& L = cal.layers[size_t(l)];
    if (int64_t(L.keys.absmax.size()) != kvw || int64_t(L.values.absmax.size()) != kvw)
      throw InputError(path + ": layer " + std::to_string(l) + " K/V width " + std::to_string(L.keys.absmax.size()) + ", the model " +
                       std::to_string(kvw));
    double kmax = 0;
    for (int h2 = 0; h2 < c.n_kv_heads; ++h2) {
      const float* a = L.keys.absmax.data() + int64_t(h2) * c.head_dim;
      for (int i = 0; i < c.head_dim; ++i) {
        double bound = a[i];
        if (i < rd) {
          const int j = c.rope_layout == RopeLayout::HalfSplit ? (i < rd / 2 ? i + rd / 2 : i - rd / 2) : (i ^ 1);
          bound = std::sqrt(double(a[i]) * a[i] + double(a[j]) * a[j]);
        }
        kmax = std::max(kmax, bound);
      }
    }
    double vmax = 0;
    for (float v : L.values.absmax) vmax = std::max(vmax, double(v));
    k_scale.push_back(float(kmax / 448.0));
    v_scale.push_back(float(vmax / 448.0));
  }
}

void check_compressed_tensors_export(const ExportInput& in, const ExportOptions& o, ExportSummary&) {
  if (in.scheme == "w4a4-atom")
    throw UnsupportedError(in.file->path() + ": scheme w4a4-atom (Atom W4A4: 4-bit activations, reordered input channels and "
                           "INT8 outlier columns) cannot be expressed in compressed-tensors");
  if (in.quant.value("layout", std::string()) == "q4_k")
    throw UnsupportedError(in.file->path() + ": K-quant weights (--k-quant, GGML's Q4_K: a float minimum per group, which "
                           "compressed-tensors' integer zero points cannot hold); export them with --format gguf");
  if (!quantized_scheme(in.scheme) && !float_scheme(in.scheme))
    throw UnsupportedError(in.file->path() + ": scheme '" + in.scheme + "' cannot be expressed in compressed-tensors");
  if (float_scheme(in.scheme) && !o.kv.empty())
    throw UnsupportedError(in.file->path() + ": --kv fp8 needs a quantized scheme (w8a8 or w4a16); this model is " + in.scheme);
  const Plan p = make_plan(in);  // UnsupportedError for an architecture without a plan
  if (!rotation_from_quantization(in.quant, in.file->path()).online.empty()) {
    // Online Hadamard rotations become transform_config (compressed-tensors' transforms, which vLLM
    // runs) on W8A8 files of dense models.
    if (in.scheme != "w8a8")
      throw UnsupportedError(in.file->path() + ": online Hadamard rotations are exported for --scheme w8a8 only (compressed-tensors "
                             "keeps its transform_config inside quantization_config); this model is " + in.scheme +
                             ": convert it with --rotate none");
    if (in.config.spec.n_experts > 0)
      throw UnsupportedError(in.file->path() + ": online Hadamard rotations of a mixture of experts: transformers 5 holds the experts "
                             "as fused parameters, not nn.Linear modules a transform can target: convert with --rotate none");
    for (const HfPlanEntry& e : p.entries)
      if (e.linear && e.conv1d)
        throw UnsupportedError(in.file->path() + ": online Hadamard rotations of " + in.config.architecture + ", whose '" + e.name +
                               "' is a Conv1D (compressed-tensors' transforms target nn.Linear): convert with --rotate none");
    transform_config(in, p);  // its refusals, before anything is written
  }
  ModelConfig written = p.config;
  written.rope_layout = RopeLayout::HalfSplit;
  make_hf_config_json(written, "float32");
  for (const HfPlanEntry& e : p.entries) {
    if (!e.linear) continue;
    for (const std::string& s : e.sources) {
      if (!is_quantized_weight(in, s)) continue;
      if (e.conv1d)
        throw UnsupportedError(in.file->path() + ": quantized '" + s + "' would be the Conv1D '" + e.name + "' of " + in.config.architecture +
                               " (not an nn.Linear: compressed-tensors / transformers do not quantize it); export it with --format hf");
      const SqmTensorInfo& wi = in.file->info(s + ".weight");
      if (wi.dtype != SqmDType::I8) {
        const int64_t g = in.quant.value("group_size", int64_t(0));
        if (g <= 0 || wi.shape[1] % g != 0)
          throw UnsupportedError(in.file->path() + ": '" + s + ".weight' has " + std::to_string(wi.shape[1]) + " input columns, not a multiple " +
                                 "of group size " + std::to_string(g) + " (a ragged last group): compressed-tensors' group strategy " +
                                 "cannot express it");
      }
    }
  }
  if (!o.kv.empty()) {
    std::vector<float> k, v;
    calibration_kv_scales(in, o.calibration, k, v);
  }
}

namespace {

std::shared_ptr<const std::string> bytes_of(const void* p, size_t n) {
  return std::make_shared<const std::string>(static_cast<const char*>(p), n);
}

SafetensorsOutput raw_output(const std::string& name, const char* dtype, std::vector<int64_t> shape, const void* p, size_t n) {
  SafetensorsOutput o;
  o.name = name;
  o.dtype = dtype;
  o.raw_shape = std::move(shape);
  o.raw = bytes_of(p, n);
  return o;
}

SafetensorsOutput f32_output(const std::string& name, std::vector<int64_t> shape, std::vector<float> v) {
  return {name, "F32", Tensor::from_vector(std::move(shape), std::move(v)), {}, nullptr};
}

}  // namespace

void write_compressed_tensors_export(const ExportInput& in, const ExportOptions& o, const std::string& dir, ExportSummary& s) {
  const Plan p = make_plan(in);
  ModelConfig written = p.config;
  written.rope_layout = RopeLayout::HalfSplit;
  nlohmann::ordered_json config = make_hf_config_json(written, "float32");
  const auto lookup = [&](const std::string& name) { return sqm_canonical_float(in, name); };
  std::vector<SafetensorsOutput> outputs;
  std::vector<std::string> ignore;
  std::vector<std::string> int8_in_int4;  // INT8 modules (the --quantize-head LM head, W8A16) of a W4A16 file: their own config group
  std::string attn_module;  // layer 0's attention module (for the KV scales), from the entry holding k_proj
  for (const HfPlanEntry& e : p.entries) {
    bool quantized = false;
    if (e.linear)
      for (const std::string& src : e.sources) quantized = quantized || is_quantized_weight(in, src);
    if (!quantized) {
      for (auto& [name, t] : plan_float_tensors(in.config, {e}, lookup, in.file->path())) outputs.push_back({name, "F32", t, {}, nullptr});
      if (e.linear) ignore.push_back(e.name);
      // transformers 5 names every head module lm_head in memory (GPT-NeoX's embed_out is renamed
      // on load): ignore it under both names.
      if (e.linear && e.name != "lm_head" && e.sources == std::vector<std::string>{"lm_head"}) ignore.push_back("lm_head");
      continue;
    }
    for (const std::string& src : e.sources)
      if (src.find("self_attn.k_proj") != std::string::npos) attn_module = e.name.substr(0, e.name.rfind('.'));
    const SqmLinear l = stack_plan_linear(in, e);
    if (l.kind == SqmLinear::Kind::Int8 && in.scheme != "w8a8") {
      // The INT8 head of a weight-only file (W8A16): packed 8-bit weights, the format of the file's
      // other linears (pack-quantized), per-channel steps [out, 1].
      int8_in_int4.push_back(e.name);
      // transformers 5 names every head module lm_head in memory (GPT-NeoX's embed_out): both names.
      if (e.name != "lm_head" && e.sources.size() == 1 && (e.sources[0] == "lm_head" || e.sources[0] == "model.embed_tokens"))
        int8_in_int4.push_back("lm_head");
      const std::vector<int32_t> packed = pack_int_rows(l.codes, l.out, l.in, 8);
      outputs.push_back(raw_output(e.name + ".weight_packed", "I32", {l.out, (l.in + 3) / 4}, packed.data(), packed.size() * 4));
      outputs.push_back(f32_output(e.name + ".weight_scale", {l.out, 1}, l.scale));
      const int64_t shape[2] = {l.out, l.in};
      outputs.push_back(raw_output(e.name + ".weight_shape", "I64", {2}, shape, sizeof(shape)));
    } else if (l.kind == SqmLinear::Kind::Int8) {
      outputs.push_back(raw_output(e.name + ".weight", "I8", {l.out, l.in}, l.codes.data(), l.codes.size()));
      outputs.push_back(f32_output(e.name + ".weight_scale", l.scale.size() == 1 ? std::vector<int64_t>{1} : std::vector<int64_t>{l.out, 1},
                                   l.scale));
      if (l.has_input_scale) outputs.push_back(f32_output(e.name + ".input_scale", {1}, {l.input_scale}));
    } else {
      std::vector<int8_t> q(l.codes);
      if (l.asym)
        for (int8_t& v : q) v = int8_t(v - 8);  // u ∈ [0, 15] → q = u − 8 ∈ [−8, 7]
      const std::vector<int32_t> packed = pack_int_rows(q, l.out, l.in, 4);
      outputs.push_back(raw_output(e.name + ".weight_packed", "I32", {l.out, (l.in + 7) / 8}, packed.data(), packed.size() * 4));
      outputs.push_back(f32_output(e.name + ".weight_scale", {l.out, l.groups}, l.scale));
      if (l.asym) {
        std::vector<int8_t> zp(l.zero.size());
        for (size_t i = 0; i < zp.size(); ++i) zp[i] = int8_t(int(l.zero[i]) - 8);  // z ∈ [0, 15] → zp = z − 8
        const std::vector<int32_t> zpk = pack_int4_cols(zp, l.out, l.groups);
        outputs.push_back(raw_output(e.name + ".weight_zero_point", "I32", {(l.out + 7) / 8, l.groups}, zpk.data(), zpk.size() * 4));
      }
      const int64_t shape[2] = {l.out, l.in};
      outputs.push_back(raw_output(e.name + ".weight_shape", "I64", {2}, shape, sizeof(shape)));
    }
    if (!l.bias.empty()) outputs.push_back({e.name + ".bias", "F32", l.bias, {}, nullptr});
  }
  if (p.config.tied_embeddings && !is_quantized_weight(in, "model.embed_tokens")) ignore.push_back("lm_head");
  std::sort(ignore.begin(), ignore.end());

  nlohmann::ordered_json kv_scheme = nullptr;
  if (o.kv == "fp8") {
    std::vector<float> k, v;
    calibration_kv_scales(in, o.calibration, k, v);
    if (attn_module.empty()) throw UnsupportedError(in.file->path() + ": --kv fp8: no quantized k_proj to find the attention modules by");
    // attn_module is layer 0's (or some layer's) module name: replace the layer index per layer.
    const HfArchitecture* arch = hf_architecture_named(in.config.architecture);
    const std::string lp = arch ? arch->layer_prefix : "model.layers.";
    const size_t at = attn_module.find(lp);
    const size_t dot = attn_module.find('.', at + lp.size());
    for (int l = 0; l < in.config.n_layers; ++l) {
      const std::string m = attn_module.substr(0, at + lp.size()) + std::to_string(l) + attn_module.substr(dot);
      outputs.push_back(f32_output(m + ".k_scale", {1}, {k[size_t(l)]}));
      outputs.push_back(f32_output(m + ".v_scale", {1}, {v[size_t(l)]}));
    }
    kv_scheme = {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"group_size", nullptr}, {"strategy", "tensor"}, {"dynamic", false}};
    s.notes.push_back("k_scale bounds the post-RoPE key absmax from the calibration file's pre-RoPE per-channel absmax (√(a_i² + a_j²) per "
                      "rotated pair); v_scale = value absmax; both / 448");
  }
  if (const std::string note = dropped_kv_cache_note(in); !note.empty()) s.notes.push_back(note);

  if (quantized_scheme(in.scheme)) {
    const char* format = in.scheme == "w8a8" ? "int-quantized" : "pack-quantized";
    nlohmann::ordered_json group;
    group["targets"] = {"Linear"};
    group["weights"] = weights_args(in);
    group["input_activations"] = input_args(in);
    group["output_activations"] = nullptr;
    group["format"] = format;
    nlohmann::ordered_json qc;
    qc["config_groups"] = {{"group_0", group}};
    qc["format"] = format;
    if (!int8_in_int4.empty()) {
      // compressed-tensors gives a module the scheme of its most specific target (an exact module
      // name before the class "Linear"), so the INT8 head keeps its own scheme: per-channel INT8
      // weights with FP32 activations (W8A16, as sqkit runs the head of a weight-only file), packed
      // like the 4-bit linears (one format for the file: transformers' decompression and vLLM's
      // WNA16 kernels take 4 and 8 bits).
      nlohmann::ordered_json head;
      head["targets"] = int8_in_int4;
      head["weights"] = int8_weights_args("channel");
      head["input_activations"] = nullptr;
      head["output_activations"] = nullptr;
      head["format"] = "pack-quantized";
      qc["config_groups"]["group_1"] = head;
    }
    qc["global_compression_ratio"] = nullptr;
    qc["ignore"] = ignore;
    qc["kv_cache_scheme"] = kv_scheme;
    qc["quant_method"] = "compressed-tensors";
    qc["quantization_status"] = "compressed";
    if (nlohmann::ordered_json t = transform_config(in, p); !t.is_null()) {
      qc["transform_config"] = t;
      s.notes.push_back("online Hadamard rotations: quantization_config.transform_config (compressed-tensors transforms at the input of " +
                        std::to_string(t.at("config_groups").size()) + " rotated activation sites; vLLM runs them, transformers 5.24 "
                        "loads the file without them: apply compressed_tensors.transform.apply_transform_config after loading)");
    }
    config["quantization_config"] = qc;
    s.quantization_config = qc;
  }
  write_safetensors(dir + "/model.safetensors", outputs, {{"format", "pt"}});
  s.tensors = int64_t(outputs.size());
  write_text_file(dir + "/config.json", config.dump(2) + "\n");
  s.files.push_back("model.safetensors");
  s.files.push_back("config.json");
  write_export_tokenizer(in, dir, s);
}

}  // namespace sq
