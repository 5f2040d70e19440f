#include "calib/recipe_writer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "formats/fingerprint.h"
#include "formats/gguf_tokenizer.h"
#include "formats/safetensors.h"
#include "formats/tokenizer.h"
#include "model/sqm_model.h"

namespace sq {

void write_float(SqmWriter& w, const std::string& name, const Tensor& t, ConvertScheme encoding) {
  if (encoding == ConvertScheme::F16 || encoding == ConvertScheme::BF16) {
    std::vector<uint16_t> h(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < h.size(); ++i) h[i] = encoding == ConvertScheme::F16 ? float_to_half(t.data()[i]) : float_to_bf16(t.data()[i]);
    w.add_tensor(name, encoding == ConvertScheme::F16 ? SqmDType::F16 : SqmDType::BF16, t.shape(), h.data(), h.size() * 2);
  } else {
    w.add_tensor(name, SqmDType::F32, t.shape(), t.data(), static_cast<size_t>(t.numel()) * 4);
  }
}

void write_float_linear(SqmWriter& w, const Checkpoint& ck, const LinearSlot& s, ConvertScheme encoding) {
  write_float(w, s.name + ".weight", ck.get(s.name + ".weight", {s.out, s.in}), encoding);
  if (s.bias) write_float(w, s.name + ".bias", ck.get(s.name + ".bias", {s.out}), encoding);
}

std::unique_ptr<Linear> dense_linear(const Checkpoint& ck, const LinearSlot& s) {
  auto d = std::make_unique<DenseLinear>(ck.get(s.name + ".weight", {s.out, s.in}), s.bias ? ck.get(s.name + ".bias", {s.out}) : Tensor());
  d->set_prepack(false);  // a converted layer runs once (the next layer's inputs): no packed copy of it
  return d;
}

void write_int8_linear(SqmWriter& w, const Tensor& W, const Tensor* bias, const std::string& base, WeightGranularity weight,
                       ActQuant act, float step) {
  const int64_t out = W.dim(0), in = W.dim(1);
  std::vector<int8_t> q(size_t(out * in));
  std::vector<float> scales(weight == WeightGranularity::PerChannel ? size_t(out) : 1);
  quantize_weight(W.data(), out, in, weight, q.data(), scales.data());
  write_int8_linear_codes(w, q, scales, out, in, bias, base, act, step);
}

void write_int8_linear_codes(SqmWriter& w, const std::vector<int8_t>& codes, const std::vector<float>& scales, int64_t out,
                             int64_t in, const Tensor* bias, const std::string& base, ActQuant act, float step) {
  w.add_tensor(base + ".weight", SqmDType::I8, {out, in}, codes.data(), codes.size());
  w.add_tensor(base + ".weight_scale", SqmDType::F32, {int64_t(scales.size())}, scales.data(), scales.size() * 4);
  if (act == ActQuant::PerTensorStatic) w.add_tensor(base + ".input_scale", SqmDType::F32, {1}, &step, 4);
  if (bias) write_float(w, base + ".bias", *bias, ConvertScheme::F32);
}

Int8Rows quantize_int8_rows_fp16_steps(const Tensor& W, const std::string& base) {
  const int64_t out = W.dim(0), in = W.dim(1);
  Int8Rows r;
  r.codes.resize(size_t(out * in));
  r.steps.resize(static_cast<size_t>(out));
  for (int64_t i = 0; i < out; ++i) {
    const float* row = W.data() + i * in;
    float absmax = 0.0f;
    for (int64_t k = 0; k < in; ++k) {
      if (!std::isfinite(row[k])) throw InputError("tensor '" + base + ".weight' row " + std::to_string(i) + " holds a non-finite value");
      absmax = std::max(absmax, std::fabs(row[k]));
    }
    const float d = half_to_float(float_to_half(absmax / 127.0f));  // 0 for a zero row (or one below FP16's range)
    if (!std::isfinite(d)) throw InputError("tensor '" + base + ".weight' row " + std::to_string(i) + ": step " + std::to_string(absmax / 127.0f) + " overflows FP16");
    r.steps[size_t(i)] = d;
    for (int64_t k = 0; k < in; ++k)
      r.codes[size_t(i * in + k)] = d > 0.0f ? int8_t(std::clamp(std::nearbyint(row[k] / d), -127.0f, 127.0f)) : int8_t(0);
  }
  return r;
}

void write_int8_rows(SqmWriter& w, const Int8Rows& r, int64_t out, int64_t in, const std::string& base) {
  w.add_tensor(base + ".weight", SqmDType::I8, {out, in}, r.codes.data(), r.codes.size());
  w.add_tensor(base + ".weight_scale", SqmDType::F32, {out}, r.steps.data(), r.steps.size() * 4);
}

void write_int8_rows_fp16_steps(SqmWriter& w, const Tensor& W, const std::string& base) {
  write_int8_rows(w, quantize_int8_rows_fp16_steps(W, base), W.dim(0), W.dim(1), base);
}

std::string LinearQuantizer::embedding_format(const ConvertInputs& in) const {
  const std::string& t = in.o.token_embedding_type;
  if (t != "auto" && !in.o.quantize_head)
    throw UsageError("--token-embedding-type " + t + " needs --quantize-head (without it the embedding stays FP32)");
  if (t != "auto" && t != "int8")
    throw UsageError("--token-embedding-type " + t + " is not offered by --scheme " + std::string(scheme_name(in.o.scheme)) +
                     " (int8 or auto; int4 needs --scheme w4a16)");
  return in.o.quantize_head ? "int8" : "fp32";
}

void LinearQuantizer::write_embedding(const ConvertInputs& in, SqmWriter& out) {
  if (!in.o.quantize_head) return write_float(out, names::kEmbed, in.base.tensors.at(names::kEmbed), float_encoding());
  if (weight_only_head()) return write_int8_rows_fp16_steps(out, in.base.tensors.at(names::kEmbed), "model.embed_tokens");
  // No input_scale: the rows are looked up (and, tied, run as the head with per-token activations).
  write_int8_linear(out, in.base.tensors.at(names::kEmbed), nullptr, "model.embed_tokens", WeightGranularity::PerChannel,
                    ActQuant::PerToken, 0.0f);
}

void LinearQuantizer::write_head(const ConvertInputs& in, SqmWriter& out) {
  if (!in.o.quantize_head) return write_float(out, names::kLmHead, in.lm_head(), float_encoding());
  if (weight_only_head()) return write_int8_rows_fp16_steps(out, in.lm_head(), "lm_head");
  write_int8_linear(out, in.lm_head(), nullptr, "lm_head", WeightGranularity::PerChannel, ActQuant::PerToken, 0.0f);
}

void write_embedding_globals(SqmWriter& out, const ConvertInputs& in, ConvertScheme encoding) {
  for (const GlobalTensorSlot& g : decoder_global_tensors(in.config))
    if (g.name != names::kFinalNormBias) write_float(out, g.name, in.base.get(g.name, g.shape), encoding);
}

void write_layer_tensors(SqmWriter& out, const ConvertInputs& in, const LayerWork& w, ConvertScheme encoding) {
  for (const LayerTensorSlot& t : decoder_layer_tensors(in.config, w.layer)) write_float(out, t.name, w.tensors.get(t.name, {t.size}), encoding);
}

void write_final_norm(SqmWriter& out, const ConvertInputs& in, ConvertScheme encoding) {
  write_float(out, names::kFinalNorm, in.base.tensors.at(names::kFinalNorm), encoding);
  for (const GlobalTensorSlot& g : decoder_global_tensors(in.config))
    if (g.name == names::kFinalNormBias) write_float(out, g.name, in.base.get(g.name, g.shape), encoding);
}

nlohmann::json converter_header(SqmWriter& out, const ConvertInputs& in) {
  const ConvertOptions& o = in.o;
  nlohmann::json header;
  header["producer"] = std::string("sqkit ") + SQ_VERSION + " sq-convert";
  header["model_config"] = model_config_to_json(in.config);
  header["source"] = {{"format", in.src.format}, {"fingerprint", in.fingerprint()}};
  if (!o.tokenizer_path.empty()) {
    // The tokenizer's own file verbatim, or for a GGUF model a metadata-only GGUF of its
    // tokenizer.* keys (formats/gguf_tokenizer.h); load_tokenizer_from_bytes reads any of them back.
    std::string format;
    const std::string bytes = tokenizer_bytes_for_embedding(o.tokenizer_path, &format);
    const std::string tname = format == "sentencepiece" ? "tokenizer.model"
                              : format == "llama2c"     ? "tokenizer.bin"
                              : format == "hf-json"     ? "tokenizer.json"
                                                        : "tokenizer.gguf";
    out.add_tensor(tname, SqmDType::U8, {int64_t(bytes.size())}, bytes.data(), bytes.size());
    header["tokenizer"] = {{"format", format}, {"tensor", tname}};
  }
  if (!o.calib_path.empty()) {
    const auto& pv = in.calib.provenance;
    header["calibration"] = {{"file_sha256", sha256_file_hex(o.calib_path)}, {"model_fingerprint", pv.model_fingerprint},
                             {"text", in.text.path.empty() ? pv.text_path : in.text.path}, {"text_sha256", pv.text_sha256},
                             {"samples", pv.samples}, {"seq_len", pv.seq_len}, {"seed", pv.seed}, {"sqkit_version", pv.sqkit_version}};
  }
  return header;
}

}  // namespace sq
