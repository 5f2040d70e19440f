#include "formats/gguf_export.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "formats/bpe_tokenizer.h"
#include "formats/rotation_header.h"
#include "formats/config_tensor_check.h"
#include "formats/gguf_architecture.h"
#include "formats/gguf_checkpoint.h"
#include "formats/gguf_file.h"
#include "formats/gguf_writer.h"
#include "formats/mapped_file.h"
#include "formats/safetensors.h"
#include "formats/sqm_file.h"
#include "model/sqm_model.h"
#include "quant/q4k_layout.h"

namespace sq {

namespace {

// ---- the .sqm side -------------------------------------------------------------------------------

/// How one .sqm tensor holds its values.
enum class SrcKind { Float, Int4Sym, Int4Asym, Int4KQuant, Int8 };

/// A .sqm tensor viewed as rows × cols (1-D: one row), with what dequantizes it.
struct Source {
  std::string name;
  SrcKind kind = SrcKind::Float;
  SqmDType dtype = SqmDType::F32;
  std::vector<int64_t> shape;
  int64_t rows = 1, cols = 0;
  const uint8_t* data = nullptr;
  // INT4: group size, FP16 scales [rows, G], U4 zeros flat [rows, G] (asymmetric).
  int64_t group = 0, groups = 0;
  const uint16_t* scales16 = nullptr;
  const uint8_t* zeros = nullptr;
  // K-quant (quant/q4k_layout.h): the super-block heads [rows, S, 16] and, expanded from them, the
  // FP16 Δ (scales16 points at kscales) and float minimums m per group of 32.
  const uint8_t* heads = nullptr;
  std::vector<uint16_t> kscales, kmins;
  // INT8: F32 step per row (per-channel) or one (per-tensor).
  std::vector<float> scales8;

  float scale8(int64_t r) const { return scales8.size() == 1 ? scales8[0] : scales8[size_t(r)]; }
  int code4(int64_t r, int64_t c) const {
    const uint64_t e = uint64_t(r) * uint64_t(cols) + uint64_t(c);
    const int nib = (e & 1) ? data[e / 2] >> 4 : data[e / 2] & 0xF;
    return kind == SrcKind::Int4Sym && nib >= 8 ? nib - 16 : nib;
  }
  int zero4(int64_t r, int64_t j) const {
    if (kind != SrcKind::Int4Asym) return 0;
    const uint64_t f = uint64_t(r) * uint64_t(groups) + uint64_t(j);
    return (f & 1) ? zeros[f / 2] >> 4 : zeros[f / 2] & 0xF;
  }
  float delta4(int64_t r, int64_t c) const { return half_to_float(scales16[r * groups + c / group]); }
  float min4(int64_t r, int64_t j) const { return half_to_float(kmins[size_t(r * groups + j)]); }

  /// Row r as sqkit's runner uses it, in FP32: Δ·(q − z), s·q, or the float value widened.
  void dequant_row(int64_t r, float* dst) const {
    switch (kind) {
      case SrcKind::Float: {
        const uint64_t base = uint64_t(r) * uint64_t(cols);
        if (dtype == SqmDType::F32) {
          std::memcpy(dst, data + base * 4, size_t(cols) * 4);
        } else {
          const auto* h = reinterpret_cast<const uint16_t*>(data) + base;
          for (int64_t c = 0; c < cols; ++c) dst[c] = dtype == SqmDType::F16 ? half_to_float(h[c]) : bf16_to_float(h[c]);
        }
        return;
      }
      case SrcKind::Int4Sym:
      case SrcKind::Int4Asym:
        for (int64_t c = 0; c < cols; ++c) dst[c] = delta4(r, c) * float(code4(r, c) - zero4(r, c / group));
        return;
      case SrcKind::Int4KQuant:  // Δ·u + m, one rounding (as the runner and GGML)
        for (int64_t c = 0; c < cols; ++c) dst[c] = std::fma(delta4(r, c), float(code4(r, c)), min4(r, c / group));
        return;
      case SrcKind::Int8: {
        const auto* q = reinterpret_cast<const int8_t*>(data) + r * cols;
        const float s = scale8(r);
        for (int64_t c = 0; c < cols; ++c) dst[c] = float(q[c]) * s;
        return;
      }
    }
  }
};

const uint8_t* raw_of(const SqmFile& f, const std::string& name, SqmDType dtype, const std::vector<int64_t>& shape) {
  if (!f.has(name))
    throw InputError(f.path() + ": tensor '" + name + "' is missing (expected " + sqm_dtype_name(dtype) + " " +
                     shape_to_string(shape) + ")");
  const SqmTensorInfo& info = f.info(name);
  if (info.dtype != dtype || info.shape != shape)
    throw InputError(f.path() + ": tensor '" + name + "' is " + sqm_dtype_name(info.dtype) + " " + shape_to_string(info.shape) +
                     ", expected " + sqm_dtype_name(dtype) + " " + shape_to_string(shape));
  return f.raw(name).data;
}

/// The quantization.group_size of the header, refused unless a multiple of 32 (Q4_0/Q4_1 blocks).
int64_t int4_group(const SqmFile& f, const nlohmann::json& quant) {
  if (!quant.contains("group_size") || !quant.at("group_size").is_number_integer())
    throw InputError(f.path() + ": INT4 weights but the header has no integer quantization.group_size");
  const int64_t g = quant.at("group_size").get<int64_t>();
  if (g <= 0 || g % 32 != 0)
    throw UnsupportedError(f.path() + ": INT4 group size " + std::to_string(g) +
                           " is not a multiple of 32 (a GGUF Q4_0/Q4_1 block holds 32 weights with one scale): no GGUF export");
  return g;
}

/// The .sqm tensor `name` (a weight, norm, bias or embedding) and what dequantizes it; `consumed`
/// receives its companion tensors (scales, zeros). `blocks`: INT4 weights become Q4_0/Q4_1, so
/// their group size and row length must be multiples of 32 (false: dequantized to F32, any size).
Source load_source(const SqmFile& f, const std::string& name, const nlohmann::json& quant, std::set<std::string>& consumed,
                   bool blocks = true) {
  const SqmTensorInfo& info = f.info(name);
  Source s;
  s.name = name;
  s.dtype = info.dtype;
  s.shape = info.shape;
  if (s.shape.empty() || s.shape.size() > 2)
    throw UnsupportedError(f.path() + ": tensor '" + name + "' has shape " + shape_to_string(s.shape) + " (expected 1-D or 2-D)");
  s.rows = s.shape.size() == 2 ? s.shape[0] : 1;
  s.cols = s.shape.back();
  s.data = f.raw(name).data;
  consumed.insert(name);
  const std::string base = name.ends_with(".weight") ? name.substr(0, name.size() - 7) : name;
  switch (info.dtype) {
    case SqmDType::F32:
    case SqmDType::F16:
    case SqmDType::BF16:
      s.kind = SrcKind::Float;
      return s;
    case SqmDType::I4x2:
    case SqmDType::U4x2: {
      s.kind = info.dtype == SqmDType::I4x2 ? SrcKind::Int4Sym : SrcKind::Int4Asym;
      if (s.shape.size() != 2) throw InputError(f.path() + ": INT4 tensor '" + name + "' is not 2-D");
      s.group = blocks ? int4_group(f, quant) : quant.value("group_size", int64_t(0));
      if (s.group <= 0) throw InputError(f.path() + ": INT4 weights but the header has no positive quantization.group_size");
      if (blocks && s.cols % 32 != 0)
        throw UnsupportedError(f.path() + ": tensor '" + name + "' has rows of " + std::to_string(s.cols) +
                               " weights, not a multiple of 32 (the GGUF Q4_0/Q4_1 block): no GGUF export");
      s.groups = (s.cols + s.group - 1) / s.group;
      if (f.has(base + ".weight_superblock_scale")) {  // K-quant: heads, Δ and m expanded (exact FP16 values)
        Int4Weights w;
        w.out = s.rows;
        w.in = s.cols;
        w.group = s.group;
        w.asym = s.kind == SrcKind::Int4Asym;
        const int64_t nsb = q4k_superblocks(s.groups);
        s.heads = raw_of(f, base + ".weight_superblock_scale", SqmDType::U8, {s.rows, nsb, kQ4kHeadBytes});
        w.superblock_scales.assign(s.heads, s.heads + s.rows * nsb * kQ4kHeadBytes);
        try {
          expand_q4k_scales(w);
        } catch (const std::invalid_argument& e) {
          throw InputError(f.path() + ": tensor '" + base + ".weight_superblock_scale': " + e.what());
        }
        s.kind = SrcKind::Int4KQuant;
        s.kscales = std::move(w.scales_f16);
        s.kmins = std::move(w.mins_f16);
        s.scales16 = s.kscales.data();
        consumed.insert(base + ".weight_superblock_scale");
        return s;
      }
      s.scales16 = reinterpret_cast<const uint16_t*>(raw_of(f, base + ".weight_scale", SqmDType::F16, {s.rows, s.groups}));
      consumed.insert(base + ".weight_scale");
      if (s.kind == SrcKind::Int4Asym) {
        s.zeros = raw_of(f, base + ".weight_zero", SqmDType::U4x2, {s.rows, s.groups});
        consumed.insert(base + ".weight_zero");
      }
      return s;
    }
    case SqmDType::I8: {
      s.kind = SrcKind::Int8;
      if (s.shape.size() != 2) throw InputError(f.path() + ": INT8 tensor '" + name + "' is not 2-D");
      const std::string sname = base + ".weight_scale";
      if (!f.has(sname)) throw InputError(f.path() + ": tensor '" + sname + "' is missing (the steps of " + name + ")");
      const SqmTensorInfo& si = f.info(sname);
      const int64_t n = int64_t(si.numel());
      if (si.dtype != SqmDType::F32 || (n != s.rows && n != 1))
        throw InputError(f.path() + ": tensor '" + sname + "' is " + sqm_dtype_name(si.dtype) + " " + shape_to_string(si.shape) +
                         ", expected F32 [" + std::to_string(s.rows) + "] or [1]");
      const auto* p = reinterpret_cast<const float*>(f.raw(sname).data);
      s.scales8.assign(p, p + n);
      consumed.insert(sname);
      return s;
    }
    default:
      throw UnsupportedError(f.path() + ": tensor '" + name + "' has dtype " + sqm_dtype_name(info.dtype) + ": no GGUF export");
  }
}

void refuse_atom(const SqmFile& f, const nlohmann::json& quant) {
  if (quant.value("scheme", std::string()) == "w4a4-atom")
    throw UnsupportedError(f.path() + ": scheme 'w4a4-atom' (Atom W4A4: 4-bit activations, outlier channels, reordered inputs) "
                           "has no GGUF export");
}

// ---- the GGUF side -------------------------------------------------------------------------------

/// The GGUF architecture an .sqm config exports as; refuses the others by name.
std::string gguf_architecture_of(const SqmFile& f, const ModelConfig& c) {
  if (c.architecture == "mistral") {
    for (int w : c.spec.layer_window)
      if (w > 0 && w < c.max_seq_len)
        throw UnsupportedError(f.path() + ": architecture 'mistral' has a sliding window of " + std::to_string(w) +
                               " tokens, shorter than its context of " + std::to_string(c.max_seq_len) +
                               " tokens; llama.cpp's llama architecture has no sliding window: no GGUF export");
    return "llama";
  }
  if (c.architecture == "llama" || c.architecture == "qwen2" || c.architecture == "gemma3") return c.architecture;
  throw UnsupportedError(f.path() + ": architecture '" + c.architecture + "' has no GGUF export (expected llama, qwen2 or gemma3)");
}

/// The layer structure with the defaults made explicit, so two specs of the same model compare
/// equal: attn_scale 0 -> 1/sqrt(head_dim); windows as long as the context -> global; no window ->
/// no local RoPE base; local base 0 -> rope_theta.
DecoderSpec normalized_spec(const ModelConfig& c) {
  DecoderSpec s = c.spec;
  if (s.attn_scale == 0.0f) s.attn_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  bool windowed = false;
  for (int& w : s.layer_window) {
    if (w >= c.max_seq_len) w = 0;
    windowed = windowed || w != 0;
  }
  if (!windowed) {
    s.layer_window.clear();
    s.rope_local_theta = 0.0f;
  } else if (s.rope_local_theta == 0.0f) {
    s.rope_local_theta = c.rope_theta;
  }
  return s;
}

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

std::string windows(const std::vector<int>& w) {
  std::string s = "[";
  for (size_t i = 0; i < w.size(); ++i) s += (i ? ", " : "") + std::to_string(w[i]);
  return s + "]";
}

/// "" when `got` (what the GGUF reader derives from the metadata) is the model `want` (the .sqm's),
/// else the first difference, e.g. "qkv_bias: .sqm true, GGUF false".
std::string config_difference(const ModelConfig& want, const ModelConfig& got) {
  auto i = [](const char* what, int a, int b) { return a == b ? std::string() : std::string(what) + ": .sqm " + std::to_string(a) + ", GGUF " + std::to_string(b); };
  auto fl = [](const char* what, double a, double b) { return a == b ? std::string() : std::string(what) + ": .sqm " + num(a) + ", GGUF " + num(b); };
  for (const std::string& d :
       {i("dim", want.dim, got.dim), i("hidden_dim", want.hidden_dim, got.hidden_dim), i("n_layers", want.n_layers, got.n_layers),
        i("n_heads", want.n_heads, got.n_heads), i("n_kv_heads", want.n_kv_heads, got.n_kv_heads),
        i("head_dim", want.head_dim, got.head_dim), i("vocab_size", want.vocab_size, got.vocab_size),
        i("max_seq_len", want.max_seq_len, got.max_seq_len), fl("norm_eps", want.norm_eps, got.norm_eps),
        fl("rope_theta", want.rope_theta, got.rope_theta), i("qkv_bias", want.qkv_bias, got.qkv_bias)})
    if (!d.empty()) return d;
  if (want.rope_scaling != got.rope_scaling)
    return std::string("rope_scaling: .sqm ") + rope_scaling_type_name(want.rope_scaling.type) + " x" + num(want.rope_scaling.factor) +
           ", GGUF " + rope_scaling_type_name(got.rope_scaling.type) + " x" + num(got.rope_scaling.factor);
  const DecoderSpec a = normalized_spec(want), b = normalized_spec(got);
  if (a.layer_window != b.layer_window)
    return "sliding windows per layer: .sqm " + windows(a.layer_window) + ", GGUF " + windows(b.layer_window);
  for (const std::string& d : {fl("attn_scale", a.attn_scale, b.attn_scale), fl("embed_scale", a.embed_scale, b.embed_scale),
                               fl("rope_local_theta", a.rope_local_theta, b.rope_local_theta),
                               i("rope_dim", want.rope_dim(), got.rope_dim())})
    if (!d.empty()) return d;
  if (a != b) return "layer structure (DecoderSpec: norms, activation, biases, positions)";
  return "";
}

/// Output row `ro` of a q/k projection in llama.cpp's interleaved RoPE order reads HF (half-split)
/// row h·d + j·d/2 + i for ro = h·d + 2i + j (convert_hf_to_gguf.py's permute; the inverse of
/// formats/gguf_checkpoint.cpp's restoration).
int64_t qk_source_row(int64_t ro, int head_dim) {
  const int64_t h = ro / head_dim, rem = ro % head_dim, i = rem / 2, j = rem % 2;
  return h * head_dim + j * (head_dim / 2) + i;
}

/// One GGUF tensor to write and where it comes from.
struct Planned {
  GgufTensorSpec spec;
  Source src;
  bool permute = false;
  int head_dim = 0;
};

struct FileType {
  const char* name;
  int id;
};

FileType file_type_of(GgmlType t) {
  switch (t) {
    case GgmlType::F16: return {"MOSTLY_F16", 1};
    case GgmlType::Q4_0: return {"MOSTLY_Q4_0", 2};
    case GgmlType::Q4_1: return {"MOSTLY_Q4_1", 3};
    case GgmlType::Q4_K: return {"MOSTLY_Q4_K_S", 14};
    case GgmlType::Q8_0: return {"MOSTLY_Q8_0", 7};
    case GgmlType::BF16: return {"MOSTLY_BF16", 32};
    default: return {"ALL_F32", 0};
  }
}

GgmlType target_type(const Source& s, bool dequantize) {
  if (dequantize || s.shape.size() == 1) return GgmlType::F32;
  switch (s.kind) {
    case SrcKind::Int4Sym: return GgmlType::Q4_0;
    case SrcKind::Int4Asym: return GgmlType::Q4_1;
    case SrcKind::Int4KQuant: return s.cols % kQ4kColumns == 0 ? GgmlType::Q4_K : GgmlType::Q4_1;  // Q4_1: Δ, m are FP16 (exact)
    case SrcKind::Int8: return GgmlType::Q8_0;
    case SrcKind::Float: break;
  }
  return s.dtype == SqmDType::F16 ? GgmlType::F16 : s.dtype == SqmDType::BF16 ? GgmlType::BF16 : GgmlType::F32;
}

void put_f16(uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); }

/// Encodes source row `r` as `type` into `dst` (one GGUF row), updating the measured errors.
void encode_row(const Source& s, int64_t r, GgmlType type, uint8_t* dst, std::vector<float>& tmp, GgufExportReport& rep) {
  const int64_t n = s.cols;
  switch (type) {
    case GgmlType::F32:
      s.dequant_row(r, reinterpret_cast<float*>(tmp.data()));
      std::memcpy(dst, tmp.data(), size_t(n) * 4);
      return;
    case GgmlType::F16:
    case GgmlType::BF16:  // same dtype as stored: the bits unchanged
      std::memcpy(dst, s.data + uint64_t(r) * uint64_t(n) * 2, size_t(n) * 2);
      return;
    case GgmlType::Q4_0:  // block {f16 d; u8 qs[16]}: x[j] = d·((qs[j] & 15) − 8), x[j+16] = d·((qs[j] >> 4) − 8)
      for (int64_t b = 0; b < n / 32; ++b) {
        uint8_t* blk = dst + b * 18;
        put_f16(blk, s.scales16[r * s.groups + (b * 32) / s.group]);  // Δ is FP16 already: exact
        for (int j = 0; j < 16; ++j)
          blk[2 + j] = uint8_t((s.code4(r, b * 32 + j) + 8) | ((s.code4(r, b * 32 + j + 16) + 8) << 4));
      }
      return;
    case GgmlType::Q4_1:  // block {f16 d; f16 m; u8 qs[16]}: x = d·q + m, q the two nibbles as Q4_0
      for (int64_t b = 0; b < n / 32; ++b) {
        uint8_t* blk = dst + b * 20;
        const int64_t j = (b * 32) / s.group;
        const uint16_t d16 = s.scales16[r * s.groups + j];
        const float d = half_to_float(d16);
        const int z = s.zero4(r, j);
        const float m = s.kind == SrcKind::Int4KQuant ? s.min4(r, j) : -d * float(z);  // exact in FP32 (11-bit mantissa × 4-bit integer)
        const uint16_t m16 = float_to_half(m);
        const float mh = half_to_float(m16);
        if (!std::isfinite(mh))
          throw UnsupportedError(s.name + ": Q4_1 offset −Δ·z = " + num(m) + " overflows FP16: no GGUF export");
        if (m != 0.0f) rep.max_scale_rounding_rel = std::max(rep.max_scale_rounding_rel, std::fabs(double(mh) - m) / std::fabs(m));
        put_f16(blk, d16);
        put_f16(blk + 2, m16);
        double blk_err = 0, blk_max = 0;
        for (int k = 0; k < 16; ++k) {
          const int u0 = s.code4(r, b * 32 + k), u1 = s.code4(r, b * 32 + k + 16);
          blk[4 + k] = uint8_t(u0 | (u1 << 4));
          for (int u : {u0, u1}) {
            const float ggml = d * float(u) + mh, ours = s.kind == SrcKind::Int4KQuant ? std::fma(d, float(u), m) : d * float(u - z);
            blk_err = std::max(blk_err, std::fabs(double(ggml) - double(ours)));
            blk_max = std::max(blk_max, std::fabs(double(ours)));
          }
        }
        rep.max_weight_abs_error = std::max(rep.max_weight_abs_error, blk_err);
        if (blk_max > 0) rep.max_weight_rel_error = std::max(rep.max_weight_rel_error, blk_err / blk_max);
      }
      return;
    case GgmlType::Q4_K: {  // block_q4_K (quant/q4k_layout.h): the stored heads and the codes regrouped, exact
      const int64_t nsb = n / kQ4kColumns;
      for (int64_t b = 0; b < nsb; ++b)
        q4k_gguf_block(s.heads + (r * nsb + b) * kQ4kHeadBytes, s.data + uint64_t(r) * uint64_t(n / 2) + uint64_t(b * kQ4kColumns / 2),
                       dst + b * kQ4kBlockBytes);
      return;
    }
    case GgmlType::Q8_0: {  // block {f16 d; i8 qs[32]}: x = d·q
      const auto* q = reinterpret_cast<const int8_t*>(s.data) + r * n;
      const float sc = s.scale8(r);
      const uint16_t d16 = float_to_half(sc);
      const float d = half_to_float(d16);
      if (!std::isfinite(d)) throw UnsupportedError(s.name + ": INT8 step " + num(sc) + " overflows FP16: no GGUF export");
      if (sc != 0.0f) rep.max_scale_rounding_rel = std::max(rep.max_scale_rounding_rel, std::fabs(double(d) - sc) / std::fabs(sc));
      for (int64_t b = 0; b < n / 32; ++b) {
        uint8_t* blk = dst + b * 34;
        put_f16(blk, d16);
        std::memcpy(blk + 2, q + b * 32, 32);
        double blk_err = 0, blk_max = 0;
        for (int k = 0; k < 32; ++k) {
          const float ggml = d * float(q[b * 32 + k]), ours = float(q[b * 32 + k]) * sc;
          blk_err = std::max(blk_err, std::fabs(double(ggml) - double(ours)));
          blk_max = std::max(blk_max, std::fabs(double(ours)));
        }
        rep.max_weight_abs_error = std::max(rep.max_weight_abs_error, blk_err);
        if (blk_max > 0) rep.max_weight_rel_error = std::max(rep.max_weight_rel_error, blk_err / blk_max);
      }
      return;
    }
    default:
      throw std::logic_error("gguf export: unexpected target type");
  }
}

/// Metadata values with stable addresses.
struct Kvs {
  std::deque<GgufValue> values;
  std::deque<std::string> strings;
  std::deque<std::vector<uint8_t>> arrays;
  std::vector<std::pair<std::string, const GgufValue*>> list;

  void add(const std::string& key, GgufValue v) {
    values.push_back(std::move(v));
    list.emplace_back(key, &values.back());
  }
  void str(const std::string& key, const std::string& s) {
    GgufValue v;
    v.type = GgufValueType::STRING;
    v.str = s;
    add(key, std::move(v));
  }
  void u32(const std::string& key, uint64_t x) {
    GgufValue v;
    v.type = GgufValueType::U32;
    v.integer = x;
    add(key, std::move(v));
  }
  void f32(const std::string& key, float x) {
    GgufValue v;
    v.type = GgufValueType::F32;
    v.real = x;
    add(key, std::move(v));
  }
  void boolean(const std::string& key, bool b) {
    GgufValue v;
    v.type = GgufValueType::BOOL;
    v.integer = b ? 1 : 0;
    add(key, std::move(v));
  }
  void i32_array(const std::string& key, const std::vector<int32_t>& items) {
    arrays.emplace_back(items.size() * 4);
    if (!items.empty()) std::memcpy(arrays.back().data(), items.data(), items.size() * 4);
    GgufValue v;
    v.type = GgufValueType::ARRAY;
    v.elem_type = GgufValueType::I32;
    v.count = items.size();
    v.elems = arrays.back().data();
    add(key, std::move(v));
  }
  void str_array(const std::string& key, const std::vector<std::string>& items) {
    GgufValue v;
    v.type = GgufValueType::ARRAY;
    v.elem_type = GgufValueType::STRING;
    v.count = items.size();
    for (const std::string& s : items) {
      strings.push_back(s);
      v.strings.push_back(strings.back());
    }
    add(key, std::move(v));
  }
};

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/// "model.layers.{0..N}.X" summary of dropped per-layer tensor names.
std::string summarize_names(const std::vector<std::string>& names) {
  std::set<std::string> suffixes;
  std::set<int64_t> layers;
  std::vector<std::string> others;
  for (const std::string& n : names) {
    std::string rest;
    const int64_t l = numbered_name_index(n, "model.layers.", &rest);
    if (l >= 0) {
      layers.insert(l);
      suffixes.insert(rest);
    } else {
      others.push_back(n);
    }
  }
  std::string s;
  if (!layers.empty()) {
    s = "model.layers.{" + std::to_string(*layers.begin()) + ".." + std::to_string(*layers.rbegin()) + "}.{";
    bool first = true;
    for (const std::string& x : suffixes) s += (first ? "" : ", ") + x, first = false;
    s += "}";
  }
  for (const std::string& o : others) s += (s.empty() ? "" : ", ") + o;
  return s;
}

/// Writes a Hugging Face tokenizer.json (byte-level BPE) as llama.cpp's `gpt2` tokenizer keys, as
/// convert_hf_to_gguf.py does: tokens by id (ids the embedding has beyond the tokenizer padded with
/// "[PAD<id>]" of type UNUSED), token types, merges "LEFT RIGHT", `tokenizer.ggml.pre` named by the
/// pre-tokenizer regexes (one of llama.cpp's: gpt-2, smollm, llama-bpe, qwen2), BOS/EOS/UNK ids and
/// add_bos/add_eos. Returns "" when written, else why not (a warning).
std::string add_hf_json_tokenizer(Kvs& kv, const SqmBytes& bytes, const std::string& source, int vocab_size) {
  BpeVocabulary v;
  try {
    v = bpe_vocabulary_from_hf_json(std::string_view(reinterpret_cast<const char*>(bytes.data), bytes.size), source);
  } catch (const InputError& e) {
    return std::string("its tokenizer.json cannot be read as a byte-level BPE: ") + e.what();
  }
  std::string pre;
  for (const char* name : {"gpt-2", "smollm", "llama-bpe", "qwen2"})
    if (pre.empty() && bpe_pre_tokenizer_regexes(name, source) == v.pre_regexes) pre = name;
  if (pre.empty()) return "its tokenizer.json pre-tokenizer matches none of llama.cpp's gpt-2, smollm, llama-bpe, qwen2";
  if (v.tokens.size() > size_t(vocab_size))
    return "its tokenizer.json has " + std::to_string(v.tokens.size()) + " tokens, more than the model's " + std::to_string(vocab_size);
  std::vector<int32_t> types;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (v.tokens[i].empty()) {  // an id the tokenizer leaves unassigned
      v.tokens[i] = "[PAD" + std::to_string(i) + "]";
      v.types[i] = TokenType::Unused;
    }
    types.push_back(int32_t(v.types[i]));
  }
  for (size_t i = v.tokens.size(); i < size_t(vocab_size); ++i) {
    v.tokens.push_back("[PAD" + std::to_string(i) + "]");
    types.push_back(int32_t(TokenType::Unused));
  }
  std::vector<std::string> merges;
  merges.reserve(v.merges.size());
  for (const auto& [a, b] : v.merges) merges.push_back(a + " " + b);
  kv.str("tokenizer.ggml.model", "gpt2");
  kv.str("tokenizer.ggml.pre", pre);
  kv.str_array("tokenizer.ggml.tokens", v.tokens);
  kv.i32_array("tokenizer.ggml.token_type", types);
  kv.str_array("tokenizer.ggml.merges", merges);
  if (v.bos >= 0) kv.u32("tokenizer.ggml.bos_token_id", uint32_t(v.bos));
  if (v.eos >= 0) kv.u32("tokenizer.ggml.eos_token_id", uint32_t(v.eos));
  if (v.unk >= 0) kv.u32("tokenizer.ggml.unknown_token_id", uint32_t(v.unk));
  kv.boolean("tokenizer.ggml.add_bos_token", v.add_bos);
  kv.boolean("tokenizer.ggml.add_eos_token", v.add_eos);
  return "";
}

/// The checks and the plan shared by export_gguf and sqm_dequantized_checkpoint.
struct Prepared {
  std::shared_ptr<SqmFile> file;
  ModelConfig config;
  nlohmann::json quant;
};

Prepared prepare(const std::string& sqm_path) {
  Prepared p;
  p.file = SqmFile::open(sqm_path);
  const nlohmann::json& h = p.file->header();
  p.config = model_config_from_json(h.contains("model_config") ? h.at("model_config") : nlohmann::json(), sqm_path);
  p.quant = h.value("quantization", nlohmann::json::object());
  refuse_atom(*p.file, p.quant);
  refuse_online_rotation(p.quant, sqm_path, "GGUF");
  return p;
}

}  // namespace

nlohmann::json GgufExportReport::to_json() const {
  return {{"architecture", architecture},
          {"file_type", file_type},
          {"file_type_id", file_type_id},
          {"tensors", tensors},
          {"bytes", bytes},
          {"tensor_types", tensor_types},
          {"max_scale_rounding_rel", max_scale_rounding_rel},
          {"max_weight_abs_error", max_weight_abs_error},
          {"max_weight_rel_error", max_weight_rel_error},
          {"warnings", warnings}};
}

GgufExportReport export_gguf(const std::string& sqm_path, const std::string& out_path, const GgufExportOptions& opt) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(out_path, ec) && same_file(sqm_path, out_path))
    throw UsageError(out_path + " is the input file: refusing to overwrite it");
  if (!opt.force && fs::exists(out_path, ec)) throw UsageError(out_path + " already exists (use --force to overwrite it)");

  Prepared prep = prepare(sqm_path);
  const SqmFile& f = *prep.file;
  const ModelConfig& c = prep.config;
  const nlohmann::json& h = f.header();
  GgufExportReport rep;
  rep.architecture = gguf_architecture_of(f, c);
  const GgufArchitecture& A = *find_gguf_architecture(rep.architecture);
  const std::string P = rep.architecture + ".";
  if (c.rope_scaling.type == RopeScalingType::Llama3)
    throw UnsupportedError(sqm_path + ": RoPE scaling 'llama3' has no GGUF export (llama.cpp needs a rope_freqs.weight tensor, "
                           "which sqkit's GGUF reader refuses)");
  const bool llama_rows = std::any_of(A.layer_tensors.begin(), A.layer_tensors.end(), [](const GgufTensorRule& r) { return r.qk != GgufQkRows::None; });
  if (!llama_rows && c.rope_layout == RopeLayout::Interleaved)
    throw UnsupportedError(sqm_path + ": q/k rows in the interleaved RoPE order cannot be exported as '" + rep.architecture +
                           "' (llama.cpp runs it in NEOX mode, the half-split order)");

  // ---- the tensor plan (no data read yet beyond scales) -----------------------------------------
  std::set<std::string> consumed;
  std::vector<Planned> plan;
  auto add = [&](const GgufTensorRule& r, const std::string& gguf, const std::string& canonical) {
    std::vector<int64_t> shape;
    for (GgufDim d : r.shape) shape.push_back(gguf_dim_size(d, c));
    if (!f.has(canonical)) {
      if (r.optional && c.tied_embeddings) return;
      throw InputError(sqm_path + ": tensor '" + canonical + "' (GGUF " + gguf + ", shape " + shape_to_string(shape) + ") is missing");
    }
    Planned p;
    p.src = load_source(f, canonical, prep.quant, consumed, !opt.dequantize);
    if (p.src.shape != shape)
      throw InputError(sqm_path + ": tensor '" + canonical + "' has shape " + shape_to_string(p.src.shape) + ", expected " +
                       shape_to_string(shape));
    p.spec.name = gguf;
    p.spec.dims.assign(shape.rbegin(), shape.rend());
    p.spec.type = target_type(p.src, opt.dequantize);
    if (p.spec.type != GgmlType::F32 && p.src.cols % 32 != 0 && p.src.kind == SrcKind::Int8)
      throw UnsupportedError(sqm_path + ": tensor '" + canonical + "' has rows of " + std::to_string(p.src.cols) +
                             " weights, not a multiple of 32 (the GGUF Q8_0 block): no GGUF export");
    p.permute = r.qk != GgufQkRows::None && c.rope_layout == RopeLayout::HalfSplit;
    p.head_dim = c.head_dim;
    plan.push_back(std::move(p));
  };
  for (const GgufTensorRule& r : A.global_tensors)
    if (std::strcmp(r.gguf, "token_embd.weight") == 0) add(r, r.gguf, r.canonical);
  for (int l = 0; l < c.n_layers; ++l)
    for (const GgufTensorRule& r : A.layer_tensors) add(r, "blk." + std::to_string(l) + "." + r.gguf, names::layer(l) + r.canonical);
  for (const GgufTensorRule& r : A.global_tensors)
    if (std::strcmp(r.gguf, "token_embd.weight") != 0) add(r, r.gguf, r.canonical);

  // Everything else of the .sqm: the tokenizer, dropped extras, or a refusal.
  std::string tok_tensor;
  if (h.contains("tokenizer") && h.at("tokenizer").contains("tensor")) tok_tensor = h.at("tokenizer").at("tensor").get<std::string>();
  std::vector<std::string> input_scales, kv_tensors;
  for (const SqmTensorInfo& t : f.tensors()) {
    if (consumed.count(t.name) || t.name == tok_tensor) continue;
    if (t.name.ends_with(".input_scale")) input_scales.push_back(t.name);
    else if (t.name.find(".kv.") != std::string::npos && t.name.starts_with("model.layers.")) kv_tensors.push_back(t.name);
    else
      throw UnsupportedError(sqm_path + ": tensor '" + t.name + "' has no place in GGUF architecture '" + rep.architecture +
                             "' (sqkit does not drop weights it does not understand)");
  }
  if (!input_scales.empty())
    rep.warnings.push_back("dropped " + std::to_string(input_scales.size()) + " static activation steps (" +
                           summarize_names(input_scales) + ", preset " + prep.quant.value("preset", std::string("?")) +
                           "): GGUF has no static activation quantization");
  if (h.contains("kv_cache"))
    rep.warnings.push_back("dropped the KV-cache format " + h.at("kv_cache").dump() +
                           (kv_tensors.empty() ? std::string() : " and its " + std::to_string(kv_tensors.size()) + " tensors " + summarize_names(kv_tensors)) +
                           ": GGUF stores no KV-cache quantization (llama.cpp picks its cache type at run time)");
  else if (!kv_tensors.empty())
    rep.warnings.push_back("dropped " + std::to_string(kv_tensors.size()) + " KV-cache tensors " + summarize_names(kv_tensors));

  // ---- metadata -----------------------------------------------------------------------------------
  GgmlType main_type = GgmlType::F32;
  for (const Planned& p : plan)
    if (p.spec.dims.size() == 2 && p.spec.name.starts_with("blk.")) {
      main_type = p.spec.type;
      break;
    }
  const FileType ft = file_type_of(main_type);
  rep.file_type = ft.name;
  rep.file_type_id = ft.id;

  Kvs kv;
  kv.str("general.architecture", rep.architecture);
  kv.str("general.name", fs::path(sqm_path).stem().string());
  kv.u32("general.file_type", uint32_t(ft.id));
  kv.u32("general.quantization_version", 2);
  for (const GgufIntKey& k : A.int_keys) kv.u32(P + k.suffix, uint32_t(c.*k.field));
  for (const GgufFloatKey& k : A.float_keys) kv.f32(P + k.suffix, c.*k.field);
  kv.u32(P + "attention.key_length", uint32_t(c.head_dim));
  kv.u32(P + "attention.value_length", uint32_t(c.head_dim));
  kv.u32(P + "rope.dimension_count", uint32_t(c.rope_dim()));
  kv.u32(P + "vocab_size", uint32_t(c.vocab_size));
  if (A.sliding_window.key_suffix) {
    const DecoderSpec s = normalized_spec(c);
    int window = 0;
    for (int w : s.layer_window) window = std::max(window, w);
    if (window > 0) kv.u32(P + A.sliding_window.key_suffix, uint32_t(window));
  }
  if (c.rope_scaling.type == RopeScalingType::Linear) {
    kv.str(P + "rope.scaling.type", "linear");
    kv.f32(P + "rope.scaling.factor", c.rope_scaling.factor);
  }

  // The tokenizer: a GGUF-sourced .sqm embeds a metadata-only GGUF of its tokenizer.* keys.
  std::unique_ptr<GgufFile> tok;
  const std::string tok_format = h.contains("tokenizer") ? h.at("tokenizer").value("format", std::string()) : std::string();
  if (tok_format == "gguf" && !tok_tensor.empty()) {
    const SqmBytes b = f.raw(tok_tensor);
    tok = std::make_unique<GgufFile>(MappedFile::from_bytes(b.data, b.size, sqm_path + ":" + tok_tensor));
    for (const auto& [key, value] : tok->metadata())
      if (key.starts_with("tokenizer.")) kv.list.emplace_back(key, &value);
  } else if (tok_format == "hf-json" && !tok_tensor.empty()) {
    const std::string why = add_hf_json_tokenizer(kv, f.raw(tok_tensor), sqm_path + ":" + tok_tensor, c.vocab_size);
    if (!why.empty()) rep.warnings.push_back("no tokenizer written: " + why);
  } else if (tok_format.empty()) {
    rep.warnings.push_back("no tokenizer written: the .sqm embeds none (llama.cpp needs tokenizer.ggml.*; give the model's tokenizer when converting)");
  } else {
    rep.warnings.push_back("no tokenizer written: the embedded '" + tok_format +
                           "' tokenizer has no GGUF conversion yet (a GGUF-sourced tokenizer is copied, a byte-level BPE tokenizer.json converted)");
  }

  // Provenance.
  kv.str("sqkit.version", SQ_VERSION);
  if (h.contains("producer") && h.at("producer").is_string()) kv.str("sqkit.producer", h.at("producer").get<std::string>());
  if (h.contains("source") && h.at("source").is_object()) {
    const nlohmann::json& s = h.at("source");
    if (s.contains("format") && s.at("format").is_string()) kv.str("sqkit.source.format", s.at("format").get<std::string>());
    if (s.contains("fingerprint") && s.at("fingerprint").is_string()) kv.str("sqkit.source.fingerprint", s.at("fingerprint").get<std::string>());
  }
  kv.str("sqkit.recipe", prep.quant.dump());
  if (h.contains("calibration") && h.at("calibration").is_object()) {
    const nlohmann::json& cal = h.at("calibration");
    kv.str("sqkit.calibration", cal.dump());
    if (cal.contains("file_sha256") && cal.at("file_sha256").is_string()) kv.str("sqkit.calibration.sha256", cal.at("file_sha256").get<std::string>());
    if (cal.contains("model_fingerprint") && cal.at("model_fingerprint").is_string())
      kv.str("sqkit.calibration.fingerprint", cal.at("model_fingerprint").get<std::string>());
  }
  if (h.contains("kv_cache")) kv.str("sqkit.kv_cache", h.at("kv_cache").dump());
  kv.str("sqkit.export.outtype", opt.dequantize ? "f32" : "as-stored");
  if (!rep.warnings.empty()) kv.str_array("sqkit.export.warnings", rep.warnings);

  // The reader must read this metadata back as the .sqm's model (one source of truth).
  {
    const std::string meta = write_gguf_metadata(kv.list);
    const GgufFile back(MappedFile::from_bytes(reinterpret_cast<const uint8_t*>(meta.data()), meta.size(), out_path));
    const std::string diff = config_difference(c, gguf_model_config(back));
    if (!diff.empty())
      throw UnsupportedError(sqm_path + ": GGUF architecture '" + rep.architecture + "' cannot express this model (" + diff + "): no GGUF export");
  }
  for (const auto& [key, value] : kv.list) rep.keys.push_back(key);

  // ---- data, one tensor at a time ---------------------------------------------------------------
  std::vector<GgufTensorSpec> specs;
  for (const Planned& p : plan) specs.push_back(p.spec);
  GgufStreamWriter w(out_path, kv.list, specs);
  std::vector<uint8_t> buf;
  std::vector<float> tmp;
  for (const Planned& p : plan) {
    const uint64_t n = gguf_tensor_nbytes(p.spec);
    buf.assign(n, 0);
    tmp.resize(size_t(p.src.cols));
    const uint64_t row_bytes = p.src.rows ? n / uint64_t(p.src.rows) : 0;
    for (int64_t ro = 0; ro < p.src.rows; ++ro)
      encode_row(p.src, p.permute ? qk_source_row(ro, p.head_dim) : ro, p.spec.type, buf.data() + uint64_t(ro) * row_bytes, tmp, rep);
    w.write_next(buf.data(), buf.size());
    ++rep.tensor_types[ggml_type_name(uint32_t(p.spec.type))];
  }
  // Refuse to replace an output that appeared meanwhile.
  if (!opt.force && fs::exists(out_path, ec)) throw UsageError(out_path + " already exists (use --force to overwrite it)");
  w.finish();
  rep.tensors = int64_t(plan.size());
  rep.bytes = w.bytes_written();
  return rep;
}

Checkpoint sqm_dequantized_checkpoint(const std::string& sqm_path) {
  Prepared prep = prepare(sqm_path);
  const SqmFile& f = *prep.file;
  Checkpoint ck;
  ck.config = prep.config;
  ck.source = sqm_path;
  ck.format = "sqm";
  std::string tok_tensor;
  if (f.header().contains("tokenizer") && f.header().at("tokenizer").contains("tensor"))
    tok_tensor = f.header().at("tokenizer").at("tensor").get<std::string>();
  std::set<std::string> companions, consumed;
  auto quantized = [](const SqmTensorInfo& t) {
    return t.name.ends_with(".weight") && (t.dtype == SqmDType::I4x2 || t.dtype == SqmDType::U4x2 || t.dtype == SqmDType::I8);
  };
  for (const SqmTensorInfo& t : f.tensors())
    if (quantized(t)) {
      const std::string base = t.name.substr(0, t.name.size() - 7);
      companions.insert(base + ".weight_scale");
      companions.insert(base + ".weight_zero");
      companions.insert(base + ".weight_superblock_scale");
    }
  for (const SqmTensorInfo& t : f.tensors()) {
    if (t.name == tok_tensor || companions.count(t.name) || t.name.ends_with(".input_scale") ||
        t.name.find(".kv.") != std::string::npos)
      continue;
    if (!quantized(t) && t.dtype != SqmDType::F32 && t.dtype != SqmDType::F16 && t.dtype != SqmDType::BF16) continue;
    const Source s = load_source(f, t.name, prep.quant, consumed, /*blocks=*/false);
    Tensor out = Tensor::zeros(t.shape);
    for (int64_t r = 0; r < s.rows; ++r) s.dequant_row(r, out.mutable_data() + r * s.cols);
    ck.tensors[t.name] = std::move(out);
  }
  return ck;
}

}  // namespace sq
