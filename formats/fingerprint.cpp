#include "formats/fingerprint.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "core/checkpoint.h"
#include "core/error.h"

namespace sq {

namespace {

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdCtxDeleter>;

MdCtx sha256_init() {
  MdCtx ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("OpenSSL: cannot initialize SHA-256");
  return ctx;
}

std::string sha256_final_hex(EVP_MD_CTX* ctx) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx, md, &len) != 1) throw std::runtime_error("OpenSSL: SHA-256 failed");
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(hex[md[i] >> 4]);
    out.push_back(hex[md[i] & 15]);
  }
  return out;
}

std::string float_string(float v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

}  // namespace

std::string sha256_hex(std::string_view bytes) {
  MdCtx ctx = sha256_init();
  if (EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size()) != 1) throw std::runtime_error("OpenSSL: SHA-256 failed");
  return sha256_final_hex(ctx.get());
}

std::string sha256_file_hex(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError("cannot read " + path + ": it is a directory");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw InputError("cannot open " + path + ": " + std::strerror(errno));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> closer(f, std::fclose);
  MdCtx ctx = sha256_init();
  std::vector<char> buf(size_t{1} << 20);
  for (;;) {
    const size_t n = std::fread(buf.data(), 1, buf.size(), f);
    if (n > 0 && EVP_DigestUpdate(ctx.get(), buf.data(), n) != 1) throw std::runtime_error("OpenSSL: SHA-256 failed");
    if (n < buf.size()) {
      if (std::ferror(f)) throw InputError("cannot read " + path + ": " + std::strerror(errno));
      break;
    }
  }
  return sha256_final_hex(ctx.get());
}

namespace {
std::string fingerprint_json(const ModelConfig& c, const TensorShapes& shapes) {
  nlohmann::json config = {
      {"architecture", c.architecture},
      {"dim", c.dim},
      {"hidden_dim", c.hidden_dim},
      {"n_layers", c.n_layers},
      {"n_heads", c.n_heads},
      {"n_kv_heads", c.n_kv_heads},
      {"head_dim", c.head_dim},
      {"vocab_size", c.vocab_size},
      {"max_seq_len", c.max_seq_len},
      {"norm_eps", float_string(c.norm_eps)},
      {"rope_theta", float_string(c.rope_theta)},
      {"rope_layout", rope_layout_name(c.rope_layout)},
      {"tied_embeddings", c.tied_embeddings},
      {"qkv_bias", c.qkv_bias},
      {"bos_id", c.bos_id},
      {"eos_id", c.eos_id},
  };
  if (!c.rope_scaling.is_default()) {  // absent for plain RoPE, so unscaled fingerprints are unchanged
    nlohmann::json rs = {{"type", rope_scaling_type_name(c.rope_scaling.type)}, {"factor", float_string(c.rope_scaling.factor)}};
    if (c.rope_scaling.type == RopeScalingType::Llama3) {
      rs["low_freq_factor"] = float_string(c.rope_scaling.low_freq_factor);
      rs["high_freq_factor"] = float_string(c.rope_scaling.high_freq_factor);
      rs["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    }
    config["rope_scaling"] = std::move(rs);
  }
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& [name, shape] : shapes) tensors[name] = {{"dtype", "f32"}, {"shape", shape}};
  const nlohmann::json doc = {{"config", std::move(config)}, {"tensors", std::move(tensors)}};
  return doc.dump();  // compact; nlohmann::json objects are std::map-ordered (sorted keys)
}
}  // namespace

std::string model_fingerprint_json(const Checkpoint& ckpt) {
  TensorShapes shapes;
  for (const auto& [name, t] : ckpt.tensors) shapes[name] = t.shape();
  return fingerprint_json(ckpt.config, shapes);
}

std::string model_fingerprint(const Checkpoint& ckpt) { return sha256_hex(model_fingerprint_json(ckpt)); }

std::string model_fingerprint(const ModelConfig& config, const TensorShapes& shapes) {
  return sha256_hex(fingerprint_json(config, shapes));
}

}  // namespace sq
