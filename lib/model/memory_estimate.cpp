#include "model/memory_estimate.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "formats/gguf_checkpoint.h"
#include "formats/gguf_file.h"
#include "formats/hf_checkpoint.h"
#include "formats/llama2c_checkpoint.h"
#include "formats/sqm_file.h"
#include "model/linear.h"
#include "model/sqm_model.h"
#include "ops/weight_matmul.h"

namespace sq {

ModelFootprint model_footprint(const std::string& path) {
  namespace fs = std::filesystem;
  ModelFootprint m;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    m.format = "hf-safetensors";
    // The reader checks the config against the tensor headers (a hostile num_hidden_layers = 1e9 is
    // refused naming the key and the tensors, not estimated) and maps only headers.
    m.config = HfCheckpointReader(path).config();
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".safetensors") m.file_bytes += int64_t(e.file_size(ec));
  } else if (looks_like_sqm(path)) {
    m.format = "sqm";
    const auto f = SqmFile::open(path, /*verify_checksums=*/false);
    const auto& h = f->header();
    m.config = model_config_from_json(h.contains("model_config") ? h.at("model_config") : nlohmann::json(), path);
    m.file_bytes = int64_t(fs::file_size(path, ec));
  } else if (looks_like_gguf(path)) {
    m.format = "gguf";
    const GgufFile f(path);
    m.config = gguf_checked_model_config(f);
    m.file_bytes = int64_t(fs::file_size(path, ec));
  } else if (looks_like_llama2c_checkpoint(path)) {
    m.format = "llama2c";
    m.file_bytes = int64_t(fs::file_size(path, ec));
    // The weights are FP32 views of the mapped file: its size is the model's FP32 size.
    m.fp32_bytes = m.linear_fp32_bytes = m.file_bytes;
    return m;
  } else {
    if (!fs::exists(path, ec)) throw InputError("cannot open " + path + ": no such file or directory");
    throw InputError(path + ": not a recognized model (expected a llama2.c checkpoint, a GGUF file, a .sqm file or a "
                            "Hugging Face checkpoint directory with config.json and *.safetensors)");
  }
  const ModelConfig& c = m.config;
  const int64_t params = c.parameter_count();
  const int64_t embed = int64_t(c.vocab_size) * c.dim, head = c.tied_embeddings ? 0 : embed;
  m.fp32_bytes = 4 * params;
  const int64_t layers_params = params - embed - head - c.dim;  // final norm ≈ dim
  m.layer_fp32_bytes = c.n_layers > 0 ? 4 * (layers_params / c.n_layers) : 0;
  m.linear_fp32_bytes = 4 * (layers_params + embed);  // the LM head (tied or not) is packed too; norms are a rounding error
  m.global_fp32_bytes = 4 * (embed + head + c.dim);
  return m;
}

void add_loaded_model(MemoryEstimate& e, const ModelFootprint& m, const std::string& label) {
  e.mapped += m.file_bytes;
  if (m.format == "sqm") {
    e.add(label + " (packed tensors)", m.file_bytes);
    const int64_t head = 4 * int64_t(m.config.vocab_size) * m.config.dim;
    if (head <= kPrepackMaxModelBytes && ops::weight_matmul_pays()) e.add(label + " LM head packed GEMM copy", head);
    return;
  }
  // llama2.c and F32 safetensors are views of the mapping; everything else is a widened copy.
  const bool views = m.format == "llama2c" || (m.format == "hf-safetensors" && m.file_bytes >= m.fp32_bytes);
  if (!views) e.add(label + " FP32 weights", m.fp32_bytes);
  // Packed copies only where DenseLinear makes them (oneDNN's brgemm kernels: AVX-512 CPUs).
  if (m.linear_fp32_bytes <= kPrepackMaxModelBytes && ops::weight_matmul_pays()) e.add(label + " packed GEMM copies", m.linear_fp32_bytes);
}

void add_forward_buffers(MemoryEstimate& e, const ModelConfig& c, int64_t tokens, int64_t kv_tokens, int threads, bool logits) {
  const int64_t width = int64_t(c.dim) * 4 + int64_t(c.hidden_dim) * 3 + int64_t(c.n_heads) * c.head_dim * 2;
  // Logits twice (the scores and their log-softmax), measured on SmolLM2 (docs/reliability.md).
  const int64_t per_window = 4 * tokens * ((logits ? 2 * int64_t(c.vocab_size) : 0) + width) +
                             4 * 2 * int64_t(c.n_layers) * kv_tokens * int64_t(c.n_kv_heads) * c.head_dim;
  e.add("activations, logits and KV cache", per_window * std::max(threads, 1));
}

int64_t hessian_bytes(const ModelConfig& c, int layers) {
  const int64_t d = c.dim, q = int64_t(c.n_heads) * c.head_dim, h = c.hidden_dim;
  return 12 * (2 * d * d + q * q + h * h) * layers;  // FP64 sums + the FP32 block product (calib/hessian.h)
}

namespace {
/// What a tool holds besides the work: the shared libraries, thread stacks and scratch. The tools
/// with a CUDA path (sq-eval, sq-run) load cuBLAS and cudart at start: `--version` peaks at 227 MB
/// RSS in the CUDA-enabled Release build, rounded up. sq-calibrate and sq-convert do not: 20 MB at
/// `--version`, plus OpenBLAS's and oneDNN's buffers once they compute (SmolLM2 `sq-calibrate
/// --hessian -t 1`: peak 322 MB, estimate 501 MB with this figure; 2-core AMD EPYC, 2026-12-01).
constexpr int64_t kRuntimeBytes = 250'000'000;
constexpr int64_t kRuntimeNoCudaBytes = 100'000'000;
}  // namespace

MemoryEstimate estimate_eval(const ModelFootprint& model, const ModelFootprint* reference, int64_t ctx, int threads) {
  MemoryEstimate e;
  e.add("runtime", kRuntimeBytes);
  add_loaded_model(e, model);
  add_forward_buffers(e, model.config, ctx, ctx, threads);
  if (reference) {
    add_loaded_model(e, *reference, "reference");
    add_forward_buffers(e, reference->config, ctx, ctx, threads);
  }
  return e;
}

MemoryEstimate estimate_eval_layer_major(const ModelFootprint& model, bool model_streamed, const ModelFootprint* reference,
                                         bool reference_streamed, int64_t ctx, int64_t group_hidden_bytes) {
  MemoryEstimate e;
  e.add("runtime", kRuntimeBytes);
  auto side = [&](const ModelFootprint& m, bool streamed, const std::string& label) {
    if (streamed) {
      e.mapped += m.file_bytes;
      e.add(label + " global tensors", m.global_fp32_bytes);
      e.add(label + " one layer", m.layer_fp32_bytes);
      e.add(label + " hidden states of a chunk group", group_hidden_bytes);
    } else {
      add_loaded_model(e, m, label);
    }
    add_forward_buffers(e, m.config, ctx, ctx, 1);
  };
  side(model, model_streamed, "model");
  if (reference) side(*reference, reference_streamed, "reference");
  return e;
}

MemoryEstimate estimate_run(const ModelFootprint& model, int64_t tokens) {
  MemoryEstimate e;
  e.add("runtime", kRuntimeBytes);
  add_loaded_model(e, model);
  add_forward_buffers(e, model.config, std::min<int64_t>(tokens, 512), tokens, 1);
  return e;
}

MemoryEstimate estimate_calibrate(const ModelFootprint& model, bool streamed, bool hessian, bool fisher, int64_t seq_len, int threads) {
  MemoryEstimate e;
  e.add("runtime", kRuntimeNoCudaBytes);
  const ModelConfig& c = model.config;
  if (streamed) {
    e.mapped += model.file_bytes;
    e.add("global tensors", model.global_fp32_bytes);
    e.add("one layer and its packed copies", 2 * model.layer_fp32_bytes);
  } else {
    add_loaded_model(e, model);
  }
  // Each thread accumulates its own Hessians in double and they are merged into one more copy:
  // (1 + 2·threads) × the Hessians' size (SmolLM2 --hessian, measured: 2.9× at -t 1, 4.7× at -t 2).
  if (hessian)
    e.add(streamed ? "one layer's Hessians (per thread and merged)" : "Hessians of every layer (per thread and merged)",
          (1 + 2 * int64_t(std::max(threads, 1))) * hessian_bytes(c, streamed ? 1 : c.n_layers));
  add_forward_buffers(e, c, seq_len, seq_len, threads, /*logits=*/!streamed);
  if (fisher) {
    const int64_t width = int64_t(c.dim) * 6 + int64_t(c.hidden_dim) * 4 + int64_t(c.n_heads) * c.head_dim * 3;
    e.add("backward pass activations", 4 * seq_len * width * c.n_layers * std::max(threads, 1));
  }
  return e;
}

MemoryEstimate estimate_convert(const ModelFootprint& model, bool streamed, bool gptq, bool runs_forward, int64_t seq_len, int threads) {
  MemoryEstimate e;
  e.add("runtime", kRuntimeNoCudaBytes);
  const ModelConfig& c = model.config;
  e.mapped += model.file_bytes;
  if (streamed) {
    e.add("global tensors", model.global_fp32_bytes);
    e.add("one layer, FP32 and quantized", 2 * model.layer_fp32_bytes);
  } else if (runs_forward) {
    add_loaded_model(e, model);
    e.mapped -= model.file_bytes;  // counted once
  } else if (!(model.format == "llama2c")) {
    e.add("FP32 weights", model.fp32_bytes);
  }
  if (gptq) e.add("one layer's Hessians", hessian_bytes(c, 1));
  if (runs_forward && seq_len > 0) add_forward_buffers(e, c, seq_len, seq_len, threads);
  return e;
}

}  // namespace sq
