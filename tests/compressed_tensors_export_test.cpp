// sq-export (issue 18): .sqm -> compressed-tensors / plain FP32 Hugging Face directories.
//
// The tiny Qwen2 checkpoint of reference/hf-tiny (2 layers, width 64, FFN 128, GQA 4/2 heads, q/k/v
// biases) is calibrated on 4 windows of 64 random ids and converted once per scheme (W8A8 O1 and
// O3, W4A16 g32 symmetric / asymmetric / GPTQ act-order, Atom, a ragged W4A16 g128, f32); each test
// exports and decodes the safetensors with an unpacking written here from the compressed-tensors
// spec (compressors/pack_quantized/helpers.py: 4-bit value q + 8 of element i of a run of 8 at bits
// 4i of one int32; zero points packed the same way along dim 0), never with the exporter's code,
// and compares codes, scales and zero points with the .sqm's own bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "calib/activation_stats.h"
#include "core/tensor.h"
#include "formats/calibration_h5.h"
#include "formats/hf_checkpoint.h"
#include "formats/safetensors.h"
#include "formats/gguf_export.h"
#include "formats/sqm_file.h"
#include "model/decoder.h"
#include "model/model_loader.h"
#include "model/sqm_model.h"
#include "quant/int4_quantize.h"
#include "runtime/kv_cache.h"
#include "tests/support/hf_tiny.h"
#include "tests/support/process.h"
#include "tests/support/test_data.h"

namespace sq::test {
namespace {

namespace fs = std::filesystem;

const char* const kLinears[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

class ExportFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir();
    const std::string name = "qwen2";
    std::mt19937 rng(18);
    std::ostringstream ids;
    for (int i = 0; i < 512; ++i) ids << rng() % 320u << ' ';
    write_file(dir_->file("cal.txt"), ids.str());
    const ProcessResult c = run_process({tool("sq-calibrate"), "-m", hf_tiny(name), "--token-ids", dir_->file("cal.txt"), "--samples", "4",
                                         "--seq-len", "64", "--hessian", "-o", calib(), "-q", "-t", "2"});
    ASSERT_EQ(c.exit_status, 0) << c.err;
    const std::vector<std::pair<std::string, std::vector<std::string>>> schemes = {
        {"w8a8-o1", {"--scheme", "w8a8", "--preset", "O1", "--calib", calib()}},
        {"w8a8-o3", {"--scheme", "w8a8", "--preset", "O3", "--calib", calib()}},
        {"w8a8-group", {"--scheme", "w8a8", "--act", "per-token-group", "--rotate", "none", "--no-gptq", "--calib", calib()}},
        {"w4a16-sym", {"--scheme", "w4a16", "--group-size", "32", "--sym"}},
        {"w4a16-asym", {"--scheme", "w4a16", "--group-size", "32", "--asym"}},
        {"w4a16-gptq-ao", {"--scheme", "w4a16", "--group-size", "32", "--asym", "--gptq", "--act-order", "--calib", calib()}},
        {"w4a16-g128", {"--scheme", "w4a16", "--group-size", "128"}},
        {"w4a16-emb4", {"--scheme", "w4a16", "--group-size", "32", "--token-embedding-type", "int4"}},
        {"atom", {"--scheme", "w4a4-atom", "--group-size", "32", "--outlier-channels", "0"}},
        {"f32", {"--scheme", "f32"}},
    };
    for (const auto& [s, args] : schemes) {
      std::vector<std::string> argv = {tool("sq-convert"), "-m", hf_tiny(name), "-o", sqm(s), "-q", "-t", "2"};
      argv.insert(argv.end(), args.begin(), args.end());
      const ProcessResult r = run_process(argv);
      ASSERT_EQ(r.exit_status, 0) << s << ": " << r.err;
    }
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string calib() { return dir_->file("calib.h5"); }
  static std::string sqm(const std::string& scheme) { return dir_->file(scheme + ".sqm"); }
  /// Runs sq-export on scheme's .sqm into a fresh directory name; returns the result.
  static ProcessResult run_export(const std::string& scheme, const std::string& format, const std::string& out,
                                  std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {tool("sq-export"), sqm(scheme), "--format", format, "-o", out};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_process(argv);
  }
  static std::string out_dir(const std::string& name) { return dir_->file("out-" + name); }
  inline static ScratchDir* dir_ = nullptr;
};

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_file(path)); }

template <class T>
std::vector<T> raw_values(const SafetensorsFile& f, const std::string& name) {
  const auto& info = f.info(name);
  std::vector<T> v((info.end - info.begin) / sizeof(T));
  std::memcpy(v.data(), f.raw_data(name), v.size() * sizeof(T));
  return v;
}

/// .sqm nibble i of a packed I4x2 / U4x2 tensor (low nibble = even index), as written in
/// docs/formats.md.
int sqm_nibble(const SqmBytes& b, int64_t i) { return (i & 1) ? b.data[i / 2] >> 4 : b.data[i / 2] & 0xF; }

std::vector<float> sqm_f32(const SqmFile& f, const std::string& name) {
  const SqmBytes b = f.raw(name);
  std::vector<float> v(b.size / 4);
  std::memcpy(v.data(), b.data, b.size);
  return v;
}

std::string layer_linear(int l, const char* proj) { return "model.layers." + std::to_string(l) + "." + proj; }

// ---- W8A8 ----------------------------------------------------------------------------------------

TEST_F(ExportFixture, CompressedTensorsW8A8O1CodesScalesAndConfig) {
  const std::string out = out_dir("w8a8-o1");
  const ProcessResult r = run_export("w8a8-o1", "compressed-tensors", out);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const nlohmann::json cfg = read_json(out + "/config.json");
  EXPECT_EQ(cfg.at("architectures")[0], "Qwen2ForCausalLM");
  EXPECT_EQ(cfg.at("hidden_size"), 64);
  const nlohmann::json& qc = cfg.at("quantization_config");
  EXPECT_EQ(qc.at("quant_method"), "compressed-tensors");
  EXPECT_EQ(qc.at("format"), "int-quantized");
  EXPECT_EQ(qc.at("quantization_status"), "compressed");
  EXPECT_EQ(qc.at("ignore"), nlohmann::json::array({"lm_head"}));
  const nlohmann::json& g = qc.at("config_groups").at("group_0");
  EXPECT_EQ(g.at("targets"), nlohmann::json::array({"Linear"}));
  EXPECT_EQ(g.at("weights").at("num_bits"), 8);
  EXPECT_EQ(g.at("weights").at("strategy"), "tensor");  // O1: per-tensor weights
  EXPECT_EQ(g.at("input_activations").at("strategy"), "token");
  EXPECT_EQ(g.at("input_activations").at("dynamic"), true);
  EXPECT_TRUE(qc.at("kv_cache_scheme").is_null());

  const auto sqm_file = SqmFile::open(sqm("w8a8-o1"));
  const SafetensorsFile st(out + "/model.safetensors");
  int checked = 0;
  for (int l = 0; l < 2; ++l)
    for (const char* proj : kLinears) {
      const std::string b = layer_linear(l, proj);
      SCOPED_TRACE(b);
      ASSERT_EQ(st.dtype(b + ".weight"), "I8");
      const SqmBytes q = sqm_file->raw(b + ".weight");
      ASSERT_EQ(st.shape(b + ".weight"), sqm_file->info(b + ".weight").shape);
      EXPECT_EQ(0, std::memcmp(st.raw_data(b + ".weight"), q.data, q.size));
      ASSERT_EQ(st.dtype(b + ".weight_scale"), "F32");
      EXPECT_EQ(st.shape(b + ".weight_scale"), (std::vector<int64_t>{1}));
      EXPECT_EQ(raw_values<float>(st, b + ".weight_scale"), sqm_f32(*sqm_file, b + ".weight_scale"));
      EXPECT_FALSE(st.has(b + ".input_scale"));
      EXPECT_EQ(st.has(b + ".bias"), sqm_file->has(b + ".bias"));
      if (sqm_file->has(b + ".bias")) {
        EXPECT_EQ(raw_values<float>(st, b + ".bias"), sqm_f32(*sqm_file, b + ".bias"));
      }
      ++checked;
    }
  EXPECT_EQ(checked, 14);
  EXPECT_TRUE(st.has("model.layers.0.self_attn.q_proj.bias"));  // Qwen2's q/k/v biases
  EXPECT_EQ(st.dtype("lm_head.weight"), "F32");
  EXPECT_EQ(st.load_f32("model.norm.weight").numel(), 64);
}

TEST_F(ExportFixture, CompressedTensorsW8A8PerTokenGroupIsTheDynamicGroupStrategy) {
  // --act per-token-group: one step per token and 32 inputs, compressed-tensors' dynamic GROUP input
  // strategy with group_size 32 (scripts/export_check.py runs it in transformers); no input_scale.
  const std::string out = out_dir("w8a8-group");
  const ProcessResult r = run_export("w8a8-group", "compressed-tensors", out);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_EQ(SqmFile::open(sqm("w8a8-group"))->header().at("quantization").at("act"), "per-token-group");
  const nlohmann::json qc = read_json(out + "/config.json").at("quantization_config");
  const nlohmann::json& ia = qc.at("config_groups").at("group_0").at("input_activations");
  EXPECT_EQ(ia.at("strategy"), "group");
  EXPECT_EQ(ia.at("group_size"), 32);
  EXPECT_EQ(ia.at("dynamic"), true);
  EXPECT_EQ(ia.at("num_bits"), 8);
  const SafetensorsFile st(out + "/model.safetensors");
  EXPECT_FALSE(st.has(layer_linear(0, "self_attn.q_proj") + ".input_scale"));
  EXPECT_TRUE(st.has(layer_linear(0, "self_attn.q_proj") + ".weight_scale"));
}

TEST_F(ExportFixture, CompressedTensorsW8A8O3StaticInputScalesAndFp8KvScales) {
  const std::string out = out_dir("w8a8-o3");
  const ProcessResult r = run_export("w8a8-o3", "compressed-tensors", out, {"--kv", "fp8", "--calibration", calib()});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const nlohmann::json qc = read_json(out + "/config.json").at("quantization_config");
  const nlohmann::json& ia = qc.at("config_groups").at("group_0").at("input_activations");
  EXPECT_EQ(ia.at("strategy"), "tensor");
  EXPECT_EQ(ia.at("dynamic"), false);
  EXPECT_EQ(qc.at("kv_cache_scheme").at("type"), "float");
  EXPECT_EQ(qc.at("kv_cache_scheme").at("num_bits"), 8);
  EXPECT_EQ(qc.at("kv_cache_scheme").at("strategy"), "tensor");
  const auto sqm_file = SqmFile::open(sqm("w8a8-o3"));
  const SafetensorsFile st(out + "/model.safetensors");
  for (int l = 0; l < 2; ++l)
    for (const char* proj : kLinears) {
      const std::string b = layer_linear(l, proj);
      ASSERT_TRUE(st.has(b + ".input_scale")) << b;
      EXPECT_EQ(st.shape(b + ".input_scale"), (std::vector<int64_t>{1}));
      EXPECT_EQ(raw_values<float>(st, b + ".input_scale"), sqm_f32(*sqm_file, b + ".input_scale")) << b;
    }
  // KV scales: v = value absmax / 448; k bounds the post-RoPE key absmax: between the pre-RoPE
  // absmax / 448 and √2 times it (√(a_i² + a_j²) ≤ √2 · max(a_i, a_j)).
  const CalibrationData cal = read_calibration_h5(calib());
  for (int l = 0; l < 2; ++l) {
    const std::string m = "model.layers." + std::to_string(l) + ".self_attn.";
    ASSERT_TRUE(st.has(m + "k_scale"));
    EXPECT_EQ(st.shape(m + "k_scale"), (std::vector<int64_t>{1}));
    const float k = raw_values<float>(st, m + "k_scale")[0], v = raw_values<float>(st, m + "v_scale")[0];
    float ka = 0, va = 0;
    for (float x : cal.layers[size_t(l)].keys.absmax) ka = std::max(ka, x);
    for (float x : cal.layers[size_t(l)].values.absmax) va = std::max(va, x);
    EXPECT_FLOAT_EQ(v, va / 448.0f);
    EXPECT_GE(k, ka / 448.0f * 0.999999f);
    EXPECT_LE(k, ka / 448.0f * 1.41422f);
  }
}

// ---- W4A16 ---------------------------------------------------------------------------------------

/// Decodes every W4A16 linear of `out` with the compressed-tensors layout and compares it with the
/// .sqm's codes, FP16 scales and zero points.
void expect_w4a16_matches(const std::string& sqm_path, const std::string& out, bool asym) {
  const auto f = SqmFile::open(sqm_path);
  const SafetensorsFile st(out + "/model.safetensors");
  for (int l = 0; l < 2; ++l)
    for (const char* proj : kLinears) {
      const std::string b = layer_linear(l, proj);
      SCOPED_TRACE(b);
      const std::vector<int64_t> shape = f->info(b + ".weight").shape;
      const int64_t rows = shape[0], cols = shape[1], G = cols / 32;
      ASSERT_EQ(st.dtype(b + ".weight_packed"), "I32");
      ASSERT_EQ(st.shape(b + ".weight_packed"), (std::vector<int64_t>{rows, (cols + 7) / 8}));
      ASSERT_EQ(st.dtype(b + ".weight_shape"), "I64");
      EXPECT_EQ(raw_values<int64_t>(st, b + ".weight_shape"), (std::vector<int64_t>{rows, cols}));
      const std::vector<int32_t> packed = raw_values<int32_t>(st, b + ".weight_packed");
      const SqmBytes codes = f->raw(b + ".weight");
      int64_t mismatches = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const uint32_t word = uint32_t(packed[size_t(r * ((cols + 7) / 8) + c / 8)]);
          const int q = int((word >> (4 * (c % 8))) & 0xF) - 8;  // compressed-tensors: signed q
          const int nib = sqm_nibble(codes, r * cols + c);
          const int expected = asym ? nib - 8 : (nib >= 8 ? nib - 16 : nib);  // u − 8, or the I4 value
          mismatches += q != expected;
        }
      EXPECT_EQ(mismatches, 0);
      ASSERT_EQ(st.dtype(b + ".weight_scale"), "F32");
      ASSERT_EQ(st.shape(b + ".weight_scale"), (std::vector<int64_t>{rows, G}));
      const std::vector<float> scale = raw_values<float>(st, b + ".weight_scale");
      const SqmBytes s16 = f->raw(b + ".weight_scale");
      for (int64_t i = 0; i < rows * G; ++i) {
        uint16_t h;
        std::memcpy(&h, s16.data + 2 * i, 2);
        ASSERT_EQ(scale[size_t(i)], half_to_float(h)) << i;
      }
      ASSERT_EQ(st.has(b + ".weight_zero_point"), asym);
      if (asym) {
        ASSERT_EQ(st.dtype(b + ".weight_zero_point"), "I32");
        ASSERT_EQ(st.shape(b + ".weight_zero_point"), (std::vector<int64_t>{(rows + 7) / 8, G}));
        const std::vector<int32_t> zp = raw_values<int32_t>(st, b + ".weight_zero_point");
        const SqmBytes z = f->raw(b + ".weight_zero");
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < G; ++j) {
            const int got = int((uint32_t(zp[size_t((r / 8) * G + j)]) >> (4 * (r % 8))) & 0xF) - 8;
            ASSERT_EQ(got, sqm_nibble(z, r * G + j) - 8) << r << "," << j;
          }
      }
      EXPECT_EQ(st.has(b + ".bias"), f->has(b + ".bias"));
      EXPECT_FALSE(st.has(b + ".weight"));
      EXPECT_FALSE(st.has(b + ".g_idx"));
    }
}

TEST_F(ExportFixture, CompressedTensorsW4A16SymmetricPacksCodesAndScales) {
  const std::string out = out_dir("w4a16-sym");
  const ProcessResult r = run_export("w4a16-sym", "compressed-tensors", out);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const nlohmann::json qc = read_json(out + "/config.json").at("quantization_config");
  // The default INT8 head (--quantize-head, W8A16) is its own group, targeted by module name, and
  // packed 8-bit (compressed-tensors' pack_to_int32: q + 128, four per word, low byte first).
  EXPECT_EQ(qc.at("format"), "pack-quantized");
  EXPECT_EQ(qc.at("config_groups").at("group_0").at("format"), "pack-quantized");
  EXPECT_EQ(qc.at("config_groups").at("group_0").at("targets"), nlohmann::json::array({"Linear"}));
  const nlohmann::json& head = qc.at("config_groups").at("group_1");
  EXPECT_EQ(head.at("targets"), nlohmann::json::array({"lm_head"}));
  EXPECT_EQ(head.at("format"), "pack-quantized");
  EXPECT_EQ(head.at("weights").at("num_bits"), 8);
  EXPECT_EQ(head.at("weights").at("strategy"), "channel");
  EXPECT_TRUE(head.at("input_activations").is_null());
  EXPECT_EQ(qc.at("ignore"), nlohmann::json::array());
  {
    // The head's codes and steps are the .sqm's INT8 rows (Qwen2 tiny: untied).
    const auto f = SqmFile::open(sqm("w4a16-sym"));
    const SafetensorsFile st(out + "/model.safetensors");
    ASSERT_EQ(f->info("lm_head.weight").dtype, SqmDType::I8);
    const std::vector<int64_t> shape = f->info("lm_head.weight").shape;
    const int64_t rows = shape[0], cols = shape[1];
    ASSERT_EQ(st.dtype("lm_head.weight_packed"), "I32");
    ASSERT_EQ(st.shape("lm_head.weight_packed"), (std::vector<int64_t>{rows, (cols + 3) / 4}));
    EXPECT_EQ(raw_values<int64_t>(st, "lm_head.weight_shape"), (std::vector<int64_t>{rows, cols}));
    const std::vector<int32_t> packed = raw_values<int32_t>(st, "lm_head.weight_packed");
    const SqmBytes q = f->raw("lm_head.weight");
    int64_t mismatches = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const uint32_t word = uint32_t(packed[size_t(r * ((cols + 3) / 4) + c / 4)]);
        mismatches += int((word >> (8 * (c % 4))) & 0xFF) - 128 != int(int8_t(q.data[r * cols + c]));
      }
    EXPECT_EQ(mismatches, 0);
    EXPECT_EQ(st.shape("lm_head.weight_scale"), (std::vector<int64_t>{rows, 1}));
    EXPECT_EQ(raw_values<float>(st, "lm_head.weight_scale"), sqm_f32(*f, "lm_head.weight_scale"));
    for (float d : sqm_f32(*f, "lm_head.weight_scale")) EXPECT_EQ(d, half_to_float(float_to_half(d)));  // FP16-exact steps
  }
  const nlohmann::json& w = qc.at("config_groups").at("group_0").at("weights");
  EXPECT_EQ(w.at("num_bits"), 4);
  EXPECT_EQ(w.at("strategy"), "group");
  EXPECT_EQ(w.at("group_size"), 32);
  EXPECT_EQ(w.at("symmetric"), true);
  EXPECT_FALSE(w.contains("actorder"));
  EXPECT_TRUE(qc.at("config_groups").at("group_0").at("input_activations").is_null());
  expect_w4a16_matches(sqm("w4a16-sym"), out, false);
}

TEST_F(ExportFixture, CompressedTensorsW4A16AsymmetricShiftsCodesAndZeroPoints) {
  const std::string out = out_dir("w4a16-asym");
  const ProcessResult r = run_export("w4a16-asym", "compressed-tensors", out);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_EQ(read_json(out + "/config.json").at("quantization_config").at("config_groups").at("group_0").at("weights").at("symmetric"), false);
  expect_w4a16_matches(sqm("w4a16-asym"), out, true);
}

TEST_F(ExportFixture, CompressedTensorsGptqActOrderIsStaticWithoutGIdx) {
  const std::string out = out_dir("w4a16-gptq-ao");
  const ProcessResult r = run_export("w4a16-gptq-ao", "compressed-tensors", out);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const nlohmann::json w = read_json(out + "/config.json").at("quantization_config").at("config_groups").at("group_0").at("weights");
  EXPECT_EQ(w.at("actorder"), "static");
  expect_w4a16_matches(sqm("w4a16-gptq-ao"), out, true);
}

// --token-embedding-type int4 (Qwen2 tiny: untied): compressed-tensors quantizes Linear modules only,
// so the embedding is written as the FP32 values the runner looks up (its INT4 rows dequantized,
// exactly), and the linears as in any W4A16 file.
TEST_F(ExportFixture, CompressedTensorsInt4EmbeddingIsWrittenDequantized) {
  const std::string out = out_dir("w4a16-emb4");
  const ProcessResult r = run_export("w4a16-emb4", "compressed-tensors", out);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const auto f = SqmFile::open(sqm("w4a16-emb4"));
  ASSERT_EQ(f->info("model.embed_tokens.weight").dtype, SqmDType::I4x2);
  const SafetensorsFile st(out + "/model.safetensors");
  ASSERT_EQ(st.dtype("model.embed_tokens.weight"), "F32");
  const Tensor want = sqm_dequantized_checkpoint(sqm("w4a16-emb4")).tensors.at("model.embed_tokens.weight");
  EXPECT_EQ(raw_values<float>(st, "model.embed_tokens.weight"), std::vector<float>(want.data(), want.data() + want.numel()));
  expect_w4a16_matches(sqm("w4a16-emb4"), out, false);
}

// ---- --format hf ---------------------------------------------------------------------------------

TEST_F(ExportFixture, HfExportW4A16IsTheRunnersDequantizationAndRunsTheSameLogits) {
  const std::string out = out_dir("hf-w4a16-asym");
  const ProcessResult r = run_export("w4a16-asym", "hf", out);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const nlohmann::json cfg = read_json(out + "/config.json");
  EXPECT_FALSE(cfg.contains("quantization_config"));
  const auto f = SqmFile::open(sqm("w4a16-asym"));
  const SafetensorsFile st(out + "/model.safetensors");
  for (int l = 0; l < 2; ++l)
    for (const char* proj : kLinears) {
      const std::string b = layer_linear(l, proj);
      Int4Weights w;
      w.out = f->info(b + ".weight").shape[0];
      w.in = f->info(b + ".weight").shape[1];
      w.group = 32;
      w.asym = true;
      const SqmBytes q = f->raw(b + ".weight"), s = f->raw(b + ".weight_scale"), z = f->raw(b + ".weight_zero");
      w.packed.assign(q.data, q.data + q.size);
      w.scales_f16.resize(s.size / 2);
      std::memcpy(w.scales_f16.data(), s.data, s.size);
      w.zeros_packed.assign(z.data, z.data + z.size);
      std::vector<float> ref(size_t(w.out * w.in));
      dequantize_int4(w, ref.data());  // lib/quant: the runner's reference dequantization
      ASSERT_EQ(st.dtype(b + ".weight"), "F32");
      EXPECT_EQ(raw_values<float>(st, b + ".weight"), ref) << b;  // bit-exact
    }
  // sqkit loads the export as a Hugging Face checkpoint: the same dequantized weights through
  // DenseLinear instead of W4A16Linear's kernel (which dequantizes in FP32 too but sums in another
  // order), so the logits agree to FP32 rounding of the dot products.
  const std::vector<int32_t> ids = hf_tiny_reference_ids("qwen2");
  const std::vector<float> a = decoder_logits(*build_model_from_sqm(SqmFile::open(sqm("w4a16-asym"))), ids);
  const std::vector<float> b = decoder_logits(*load_model(out).model, ids);
  ASSERT_EQ(a.size(), b.size());
  double max_abs = 0, max_ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(double(a[i]) - b[i]));
    max_ref = std::max(max_ref, std::abs(double(a[i])));
  }
  std::printf("hf export vs .sqm logits: max |diff| %.3g (max |logit| %.3g)\n", max_abs, max_ref);
  EXPECT_LT(max_abs, 1e-4 * max_ref);
}

TEST_F(ExportFixture, HfExportW8A8IsStepTimesCode) {
  const std::string out = out_dir("hf-w8a8-o1");
  const ProcessResult r = run_export("w8a8-o1", "hf", out);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const auto f = SqmFile::open(sqm("w8a8-o1"));
  const SafetensorsFile st(out + "/model.safetensors");
  for (int l = 0; l < 2; ++l)
    for (const char* proj : kLinears) {
      const std::string b = layer_linear(l, proj);
      const SqmBytes q = f->raw(b + ".weight");
      const std::vector<float> s = sqm_f32(*f, b + ".weight_scale");
      const std::vector<float> w = raw_values<float>(st, b + ".weight");
      ASSERT_EQ(w.size(), q.size);
      for (size_t i = 0; i < q.size; ++i) ASSERT_EQ(w[i], s[0] * float(int8_t(q.data[i]))) << b << " " << i;
    }
}

TEST_F(ExportFixture, FloatSchemeWritesAPlainCheckpoint) {
  const std::string out = out_dir("f32");
  const ProcessResult r = run_export("f32", "compressed-tensors", out, {"--json", "-"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_FALSE(read_json(out + "/config.json").contains("quantization_config"));
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("scheme"), "f32");
  EXPECT_EQ(j.at("files"), nlohmann::json::array({"config.json", "model.safetensors"}));
  const SafetensorsFile ref(hf_tiny("qwen2") + "/model.safetensors"), got(out + "/model.safetensors");
  for (const std::string& n : ref.names()) {
    const Tensor a = ref.load_f32(n), b = got.load_f32(n);
    ASSERT_EQ(a.shape(), b.shape()) << n;
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), size_t(a.numel()) * 4)) << n;
  }
}

// ---- refusals and the output location -----------------------------------------------------------

/// Entries of the scratch directory whose names start with `prefix` (outputs and temporaries).
int entries_starting(const std::string& dir, const std::string& prefix) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().rfind(prefix, 0) == 0;
  return n;
}

TEST_F(ExportFixture, RefusalsExitTwoAndWriteNothing) {
  struct Case {
    std::string scheme, format;
    std::vector<std::string> extra;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"atom", "compressed-tensors", {}, "w4a4-atom"},
      {"atom", "hf", {}, "w4a4-atom"},
      {"w4a16-g128", "compressed-tensors", {}, "ragged"},
      {"w8a8-o1", "gguf-nope", {}, "--format"},
      {"w8a8-o1", "hf", {"--kv", "fp8", "--calibration", "x.h5"}, "compressed-tensors only"},
      {"w8a8-o1", "compressed-tensors", {"--kv", "fp8"}, "--calibration"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scheme + " " + c.format);
    const std::string out = out_dir("refused");
    const ProcessResult r = run_export(c.scheme, c.format, out, c.extra);
    EXPECT_EQ(r.exit_status, 2) << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(entries_starting(dir_->path(), "out-refused"), 0);
  }
  // Not a .sqm: the tiny checkpoint's config.json.
  const ProcessResult r = run_process({tool("sq-export"), hf_tiny("qwen2") + "/config.json", "--format", "hf", "-o", out_dir("refused")});
  EXPECT_EQ(r.exit_status, 2);
  EXPECT_NE(r.err.find("not an sqkit .sqm file"), std::string::npos) << r.err;
  EXPECT_EQ(entries_starting(dir_->path(), "out-refused"), 0);
}

TEST_F(ExportFixture, ExistingOutputNeedsForceAndIsReplacedOnlyOnSuccess) {
  const std::string out = out_dir("existing");
  fs::create_directories(out);
  write_file(out + "/keep.txt", "old");
  ProcessResult r = run_export("w4a16-sym", "hf", out);
  EXPECT_EQ(r.exit_status, 2);
  EXPECT_NE(r.err.find("already exists"), std::string::npos) << r.err;
  // A refused export with --force leaves the old directory as it was.
  r = run_export("atom", "hf", out, {"--force"});
  EXPECT_EQ(r.exit_status, 2);
  EXPECT_TRUE(fs::exists(out + "/keep.txt"));
  r = run_export("w4a16-sym", "hf", out, {"--force"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_FALSE(fs::exists(out + "/keep.txt"));
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  EXPECT_EQ(entries_starting(dir_->path(), "out-existing"), 1);  // no temporary left beside it
  // Writing into the input's own directory is refused.
  r = run_process({tool("sq-export"), sqm("w4a16-sym"), "--format", "hf", "-o", dir_->path(), "--force"});
  EXPECT_EQ(r.exit_status, 2);
  EXPECT_NE(r.err.find("input"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(sqm("w4a16-sym")));
}

// ---- fused layouts (Phi-3: qkv_proj = [q; k; v], gate_up_proj = [gate; up]) -----------------------

TEST(ExportFused, Phi3StacksRowsWithTheirScalesAndRefusesDifferentPerTensorScales) {
  ScratchDir dir;
  const std::string pc = dir.file("pc.sqm"), pt = dir.file("pt.sqm");
  ProcessResult r = run_process({tool("sq-convert"), "-m", hf_tiny("phi3"), "-o", pc, "-q", "-t", "2", "--scheme", "w8a8", "--no-smooth",
                                 "--weight", "per-channel", "--act", "per-token", "--rotate", "none"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  r = run_process({tool("sq-export"), pc, "--format", "compressed-tensors", "-o", dir.file("ct")});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const auto f = SqmFile::open(pc);
  const SafetensorsFile st(dir.file("ct") + "/model.safetensors");
  EXPECT_EQ(read_json(dir.file("ct") + "/config.json").at("architectures")[0], "Phi3ForCausalLM");
  for (int l = 0; l < 2; ++l) {
    const std::string a = "model.layers." + std::to_string(l) + ".self_attn.", m = "model.layers." + std::to_string(l) + ".mlp.";
    for (const auto& [fused, parts] : std::vector<std::pair<std::string, std::vector<std::string>>>{
             {a + "qkv_proj", {a + "q_proj", a + "k_proj", a + "v_proj"}}, {m + "gate_up_proj", {m + "gate_proj", m + "up_proj"}}}) {
      std::string codes;
      std::vector<float> scales;
      int64_t rows = 0;
      for (const auto& p : parts) {
        const SqmBytes q = f->raw(p + ".weight");
        codes.append(reinterpret_cast<const char*>(q.data), q.size);
        const auto s = sqm_f32(*f, p + ".weight_scale");
        scales.insert(scales.end(), s.begin(), s.end());
        rows += f->info(p + ".weight").shape[0];
      }
      ASSERT_EQ(st.shape(fused + ".weight"), (std::vector<int64_t>{rows, 64})) << fused;
      EXPECT_EQ(0, std::memcmp(st.raw_data(fused + ".weight"), codes.data(), codes.size())) << fused;
      EXPECT_EQ(st.shape(fused + ".weight_scale"), (std::vector<int64_t>{rows, 1}));
      EXPECT_EQ(raw_values<float>(st, fused + ".weight_scale"), scales) << fused;
    }
  }
  // The float path (--format hf) writes the same fused plan, which sqkit reads back as Phi-3.
  r = run_process({tool("sq-export"), pc, "--format", "hf", "-o", dir.file("hf")});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_EQ(load_model(dir.file("hf")).model->config().architecture, "phi3");
  // O1: per-tensor weight scales, different for q, k and v: one qkv_proj scale cannot hold them.
  r = run_process({tool("sq-convert"), "-m", hf_tiny("phi3"), "-o", pt, "-q", "-t", "2", "--scheme", "w8a8", "--no-smooth", "--weight",
                   "per-tensor", "--act", "per-token", "--rotate", "none"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  r = run_process({tool("sq-export"), pt, "--format", "compressed-tensors", "-o", dir.file("ct-pt")});
  EXPECT_EQ(r.exit_status, 2);
  EXPECT_NE(r.err.find("per-tensor weight scales differ"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("qkv_proj"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("ct-pt")));
}

// ---- online Hadamard rotations as transform_config ----------------------------------------------

// The default W8A8 recipe rotates online (sq-convert --rotate auto): a fused module reading one
// rotated site (Phi-3's qkv_proj, gate_up_proj) is a target of that site's transform; what cannot
// carry transforms is refused with one line and nothing written (Mixtral's experts are fused
// parameters in transformers 5, GPT-2's linears Conv1D).
TEST(ExportRotated, FusedModulesAreTransformTargetsAndMoeAndConv1DAreRefused) {
  ScratchDir dir;
  const std::string phi = dir.file("phi3.sqm");
  ProcessResult r = run_process({tool("sq-convert"), "-m", hf_tiny("phi3"), "-o", phi, "-q", "-t", "2", "--scheme", "w8a8", "--no-smooth"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  r = run_process({tool("sq-export"), phi, "--format", "compressed-tensors", "-o", dir.file("ct")});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const nlohmann::json cfg = nlohmann::json::parse(read_file(dir.file("ct") + "/config.json"));
  const nlohmann::json& groups = cfg.at("quantization_config").at("transform_config").at("config_groups");
  const ModelConfig c = load_model(phi).model->config();
  const std::map<std::string, std::string> first = {{"attn_input", "model.layers.0.self_attn.qkv_proj"},
                                                    {"ffn_input", "model.layers.0.mlp.gate_up_proj"},
                                                    {"ffn_hidden", "model.layers.0.mlp.down_proj"}};
  ASSERT_EQ(groups.size(), first.size()) << groups.dump();
  for (const auto& [site, module] : first) {
    const nlohmann::json& targets = groups.at(site).at("apply").at(0).at("targets");
    EXPECT_EQ(targets.size(), size_t(c.n_layers)) << site << ": one fused module per layer";
    EXPECT_EQ(targets.at(0), module) << site;
    const int64_t width = site == "ffn_hidden" ? c.hidden_dim : c.dim;
    EXPECT_EQ(groups.at(site).at("head_dim").get<int64_t>(), width & -width) << site;  // the largest power of two dividing it
  }
  for (const char* arch : {"mixtral-moe", "gpt2"}) {
    const std::string m = dir.file(std::string(arch) + ".sqm"), out = dir.file(std::string(arch) + "-ct");
    r = run_process({tool("sq-convert"), "-m", hf_tiny(arch), "-o", m, "-q", "-t", "2", "--scheme", "w8a8", "--no-smooth"});
    ASSERT_EQ(r.exit_status, 0) << arch << ": " << r.err;
    r = run_process({tool("sq-export"), m, "--format", "compressed-tensors", "-o", out});
    EXPECT_EQ(r.exit_status, 2) << arch;
    EXPECT_NE(r.err.find(std::string(arch) == "gpt2" ? "Conv1D" : "mixture of experts"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--rotate none"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out)) << arch;
  }
}

// ---- interleaved RoPE layout (llama2.c): q/k rows reordered to half-split with their scales --------

TEST(ExportInterleaved, StoriesQKRowsMoveWithTheirScalesAndTheHfExportRunsTheSameModel) {
  ScratchDir dir;
  const std::string m = dir.file("s.sqm");
  ProcessResult r = run_process({tool("sq-convert"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-o", m, "-q", "-t", "2",
                                 "--scheme", "w8a8", "--no-smooth", "--weight", "per-channel", "--act", "per-token", "--rotate", "none"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  r = run_process({tool("sq-export"), m, "--format", "compressed-tensors", "-o", dir.file("ct")});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NE(r.err.find("llama2c"), std::string::npos) << r.err;  // its tokenizer has no HF form: a note
  const auto f = SqmFile::open(m);
  const ModelConfig c = model_config_from_json(f->header().at("model_config"), m);
  ASSERT_EQ(c.rope_layout, RopeLayout::Interleaved);
  const SafetensorsFile st(dir.file("ct") + "/model.safetensors");
  const std::string b = "model.layers.1.self_attn.k_proj";
  const int64_t in = f->info(b + ".weight").shape[1];
  const SqmBytes q = f->raw(b + ".weight");
  const std::vector<float> s = sqm_f32(*f, b + ".weight_scale"), got_s = raw_values<float>(st, b + ".weight_scale");
  const auto* got_q = reinterpret_cast<const int8_t*>(st.raw_data(b + ".weight"));
  // HF row h·hd + j·hd/2 + i is interleaved row h·hd + 2i + j (permute_qk_rows_for_half_split).
  const int hd = c.head_dim;
  for (int h = 0; h < c.n_kv_heads; ++h)
    for (int j = 0; j < 2; ++j)
      for (int i = 0; i < hd / 2; ++i) {
        const int64_t nr = h * hd + j * (hd / 2) + i, orow = h * hd + 2 * i + j;
        ASSERT_EQ(got_s[size_t(nr)], s[size_t(orow)]) << nr;
        ASSERT_EQ(0, std::memcmp(got_q + nr * in, q.data + orow * in, size_t(in))) << nr;
      }
  // The dequantized export of a W4A16 model (ragged groups: FFN width 172 with g32, fine for
  // --format hf) is a half-split HF checkpoint that sqkit runs with the same weights as the .sqm.
  const std::string w4 = dir.file("w4.sqm");
  r = run_process({tool("sq-convert"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-o", w4, "-q", "-t", "2", "--scheme",
                   "w4a16", "--group-size", "32"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  r = run_process({tool("sq-export"), w4, "--format", "hf", "-o", dir.file("hf")});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 300, 30, 9, 72};
  const std::vector<float> a = decoder_logits(*build_model_from_sqm(SqmFile::open(w4)), ids);
  const std::vector<float> d = decoder_logits(*load_model(dir.file("hf")).model, ids);
  ASSERT_EQ(a.size(), d.size());
  double max_abs = 0, max_ref = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    max_abs = std::max(max_abs, std::abs(double(a[k]) - d[k]));
    max_ref = std::max(max_ref, std::abs(double(a[k])));
  }
  std::printf("stories W4A16 .sqm vs its dequantized hf export: max |diff| %.3g (max |logit| %.3g)\n", max_abs, max_ref);
  // Same weights; RoPE over the reordered q/k rows (half-split) is the same rotation, computed on
  // rows in another order: FP32 rounding at most.
  EXPECT_LT(max_abs, 1e-4 * max_ref);
}

// ---- every architecture: the write side is the inverse of the reader ------------------------------

/// max |a − b| and max |a| over two logit vectors of equal size.
std::pair<double, double> max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(double(a[i]) - b[i]));
    m = std::max(m, std::abs(double(a[i])));
  }
  return {d, m};
}

class ExportArchitecture : public ::testing::TestWithParam<const char*> {};

/// load_hf_checkpoint → save_hf_checkpoint (the architecture's make_config + hf_plan) →
/// load_hf_checkpoint gives the same config, bit-identical canonical tensors and identical logits.
TEST_P(ExportArchitecture, FloatRoundTripIsIdentical) {
  const std::string name = GetParam();
  ScratchDir dir;
  const Checkpoint a = load_hf_checkpoint(hf_tiny(name));
  save_hf_checkpoint(a, dir.file("hf"), "F32");
  const Checkpoint b = load_hf_checkpoint(dir.file("hf"));
  EXPECT_EQ(b.config.architecture, a.config.architecture);
  EXPECT_TRUE(b.config.spec == a.config.spec);
  EXPECT_EQ(b.config.max_seq_len, a.config.max_seq_len);
  EXPECT_EQ(b.config.tied_embeddings, a.config.tied_embeddings);
  ASSERT_EQ(b.tensors.size(), a.tensors.size());
  for (const auto& [n, t] : a.tensors) {
    ASSERT_TRUE(b.tensors.count(n)) << n;
    const Tensor& u = b.tensors.at(n);
    ASSERT_EQ(u.shape(), t.shape()) << n;
    EXPECT_EQ(0, std::memcmp(u.data(), t.data(), size_t(t.numel()) * 4)) << n;
  }
  const std::vector<int32_t> ids = hf_tiny_reference_ids(name);
  EXPECT_EQ(decoder_logits(*load_model(hf_tiny(name)).model, ids), decoder_logits(*load_model(dir.file("hf")).model, ids));
}

INSTANTIATE_TEST_SUITE_P(Export, ExportArchitecture, ::testing::ValuesIn(kHfTinyCheckpoints), HfTinyParamName());

class ExportQuantizedArchitecture : public ::testing::TestWithParam<const char*> {};

/// W8A8 (O1: SmoothQuant with per-tensor weights; per-channel and per-tensor weights without
/// smoothing; per-token activations) and W4A16 g32 (symmetric and asymmetric) of each architecture: compressed-tensors exports (fused q/k/v with per-tensor
/// scales and GPT-2's Conv1D refused by name), and the dequantized --format hf export, which sqkit
/// reloads with the .sqm's weights (W4A16: the .sqm's logits to summation order).
TEST_P(ExportQuantizedArchitecture, CompressedTensorsAndDequantizedHf) {
  const std::string name = GetParam();
  ScratchDir dir;
  const std::string arch = load_hf_checkpoint(hf_tiny(name)).config.architecture;
  const bool conv1d = arch == "gpt2", fused = arch == "gpt_neox" || arch == "falcon" || arch == "bloom" || arch == "mpt";
  const std::vector<int32_t> ids = hf_tiny_reference_ids(name);
  std::mt19937 rng(18);
  std::ostringstream cal_ids;
  for (int i = 0; i < 256; ++i) cal_ids << rng() % 320u << ' ';
  write_file(dir.file("cal.txt"), cal_ids.str());
  const ProcessResult c = run_process({tool("sq-calibrate"), "-m", hf_tiny(name), "--token-ids", dir.file("cal.txt"), "--samples", "4",
                                       "--seq-len", "32", "-o", dir.file("calib.h5"), "-q", "-t", "2"});
  ASSERT_EQ(c.exit_status, 0) << c.err;
  const std::vector<std::pair<std::string, std::vector<std::string>>> schemes = {
      {"w8a8-o1", {"--scheme", "w8a8", "--preset", "O1", "--calib", dir.file("calib.h5")}},  // SmoothQuant, per-tensor weights
      {"w8a8-pc", {"--scheme", "w8a8", "--no-smooth", "--weight", "per-channel", "--act", "per-token", "--rotate", "none"}},
      {"w8a8-pt", {"--scheme", "w8a8", "--no-smooth", "--weight", "per-tensor", "--act", "per-token", "--rotate", "none"}},
      {"w4a16-sym", {"--scheme", "w4a16", "--group-size", "32", "--sym"}},
      {"w4a16-asym", {"--scheme", "w4a16", "--group-size", "32", "--asym"}},
  };
  for (const auto& [s, args] : schemes) {
    SCOPED_TRACE(name + " " + s);
    const std::string m = dir.file(s + ".sqm");
    std::vector<std::string> argv = {tool("sq-convert"), "-m", hf_tiny(name), "-o", m, "-q", "-t", "2"};
    argv.insert(argv.end(), args.begin(), args.end());
    ProcessResult r = run_process(argv);
    ASSERT_EQ(r.exit_status, 0) << r.err;
    const std::string ct = dir.file(s + "-ct"), hf = dir.file(s + "-hf");
    r = run_process({tool("sq-export"), m, "--format", "compressed-tensors", "-o", ct});
    if (conv1d || (fused && (s == "w8a8-pt" || s == "w8a8-o1"))) {
      EXPECT_EQ(r.exit_status, 2) << r.err;
      EXPECT_NE(r.err.find(conv1d ? "Conv1D" : "per-tensor weight scales differ"), std::string::npos) << r.err;
      EXPECT_FALSE(fs::exists(ct));
    } else {
      ASSERT_EQ(r.exit_status, 0) << r.err;
      const nlohmann::json cfg = read_json(ct + "/config.json");
      EXPECT_EQ(cfg.at("quantization_config").at("quant_method"), "compressed-tensors");
      // GPT-NeoX's untied head is saved as embed_out but is transformers 5's lm_head module.
      // Float in w8a8 files (ignored), the INT8 head group of w4a16 files (--quantize-head default).
      const nlohmann::json& qc = cfg.at("quantization_config");
      if (arch == "gpt_neox" && s.starts_with("w8a8")) EXPECT_NE(qc.at("ignore").dump().find("\"lm_head\""), std::string::npos);
      if (arch == "gpt_neox" && s.starts_with("w4a16"))
        EXPECT_EQ(qc.at("config_groups").at("group_1").at("targets"), nlohmann::json::array({"embed_out", "lm_head"})) << qc;
      const SafetensorsFile st(ct + "/model.safetensors");
      int quantized = 0;
      for (const std::string& n : st.names()) quantized += n.size() > 13 && n.compare(n.size() - 13, 13, ".weight_scale") == 0;
      EXPECT_GT(quantized, 0);
    }
    r = run_process({tool("sq-export"), m, "--format", "hf", "-o", hf});
    ASSERT_EQ(r.exit_status, 0) << r.err;
    const auto loaded = load_model(hf);
    EXPECT_EQ(loaded.model->config().architecture, arch);
    if (s.rfind("w8a8", 0) == 0) {
      // Through the plan and back through the reader, every INT8 linear is Δ·q of its own rows.
      const auto f = SqmFile::open(m);
      const Checkpoint back = load_hf_checkpoint(hf);
      int checked = 0;
      for (const auto& [n, t] : back.tensors) {
        if (!f->has(n) || f->info(n).dtype != SqmDType::I8 || t.rank() != 2) continue;
        const SqmBytes q = f->raw(n);
        const std::vector<float> sc = sqm_f32(*f, n.substr(0, n.size() - 7) + ".weight_scale");
        const int64_t cols = t.dim(1);
        int64_t bad = 0;
        for (int64_t i = 0; i < t.numel(); ++i)
          bad += t.data()[i] != sc[sc.size() == 1 ? 0 : size_t(i / cols)] * float(int8_t(q.data[i]));
        EXPECT_EQ(bad, 0) << n;
        ++checked;
      }
      EXPECT_GT(checked, 0);
    }
    if (s.rfind("w4a16", 0) == 0) {
      const auto [d, mx] = max_diff(decoder_logits(*build_model_from_sqm(SqmFile::open(m)), ids), decoder_logits(*loaded.model, ids));
      std::printf("%s %s: .sqm vs dequantized hf export logits max |diff| %.3g (max |logit| %.3g)\n", name.c_str(), s.c_str(), d, mx);
      EXPECT_LT(d, 1e-4 * mx);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Export, ExportQuantizedArchitecture,
                         ::testing::Values("gemma3-text", "mixtral-moe", "opt", "gpt-neox", "falcon", "bloom-alibi", "mpt-alibi", "gpt2"),
                         HfTinyParamName());

}  // namespace
}  // namespace sq::test
