// Issue 18 (GGUF part): export_gguf (formats/gguf_export.h) on .sqm files converted from the tiny
// Hugging Face checkpoints (llama-gqa, qwen2, gemma3-text; random weights, 2-6 layers, width 64) and,
// when $SQKIT_MODELS has it, SmolLM2-135M. Every export is read back with sqkit's own GGUF reader:
//  * Q4_0 (symmetric INT4) dequantizes to exactly the .sqm's dequantized weights, and the model
//    loaded from the GGUF gives bit-identical logits to the FP32 model of those weights;
//  * Q4_1 / Q8_0 weights are within the FP16 rounding bound of their offset / scale (derived
//    below), and the logits within a tolerance measured from that perturbation;
//  * metadata keys and values; the refusals (Atom, group 16, other architectures, Mistral's sliding
//    window, an existing output) throw their typed error and write nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf_checkpoint.h"
#include "formats/gguf_dequantize.h"
#include "formats/gguf_export.h"
#include "formats/bpe_tokenizer.h"
#include "formats/gguf_file.h"
#include "formats/gguf_tokenizer.h"
#include "formats/gguf_writer.h"
#include "formats/tokenizer.h"
#include "formats/safetensors.h"
#include "formats/sqm_file.h"
#include "model/decoder.h"
#include "model/model_loader.h"
#include "model/sqm_model.h"
#include "runtime/kv_cache.h"
#include "tests/support/expect_error.h"
#include "tests/support/hf_tiny.h"
#include "tests/support/real_models.h"
#include "tests/support/process.h"
#include "tests/support/test_data.h"

namespace sq::test {
namespace {

namespace fs = std::filesystem;

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float v : a) m = std::max(m, std::fabs(double(v)));
  return m;
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::ostringstream s;
  for (int32_t id : ids) s << id << ' ';
  return s.str();
}

/// The .sqm files every test uses, converted once (sq-convert on the tiny checkpoints).
struct Fixture {
  ScratchDir dir;
  std::map<std::string, std::string> calib;  // architecture -> calibration file

  std::string convert(const std::string& arch, const std::string& tag, const std::vector<std::string>& args) {
    const std::string out = dir.file(arch + "-" + tag + ".sqm");
    if (fs::exists(out)) return out;
    std::vector<std::string> argv = {tool("sq-convert"), "-m", hf_tiny(arch), "-o", out, "-q", "-t", "2"};
    for (const std::string& a : args) argv.push_back(a == "{calib}" ? calibration(arch) : a);
    const ProcessResult r = run_process(argv);
    EXPECT_EQ(r.exit_status, 0) << r.err;
    return out;
  }
  /// sq-calibrate on 4 windows of 64 random ids (every tiny checkpoint has a vocabulary of 320).
  std::string calibration(const std::string& arch) {
    if (calib.count(arch)) return calib[arch];
    std::mt19937 rng(18);
    std::vector<int32_t> ids(256);
    for (auto& id : ids) id = int32_t(rng() % 320u);
    write_file(dir.file("cal.txt"), ids_text(ids));
    const std::string out = dir.file(arch + "-calib.h5");
    const ProcessResult r = run_process({tool("sq-calibrate"), "-m", hf_tiny(arch), "--token-ids", dir.file("cal.txt"),
                                         "--samples", "4", "--seq-len", "64", "-o", out, "-q", "-t", "2"});
    EXPECT_EQ(r.exit_status, 0) << r.err;
    return calib[arch] = out;
  }
  std::string sym(const std::string& arch) { return convert(arch, "w4sym", {"--scheme", "w4a16", "--sym", "--group-size", "32"}); }
  std::string asym(const std::string& arch) { return convert(arch, "w4asym", {"--scheme", "w4a16", "--asym", "--group-size", "32"}); }
  std::string f32(const std::string& arch) { return convert(arch, "f32", {"--scheme", "f32"}); }
};

Fixture& fixture() {
  static Fixture f;  // converted once for the whole binary; its directory is removed at exit
  return f;
}

/// The GGUF checkpoint (canonical FP32 tensors) of `gguf` against the .sqm's dequantized weights:
/// every tensor present in both with the same shape; returns the largest |difference| per tensor
/// through `check(name, gguf_tensor, sqm_tensor)`.
template <typename F>
void compare_tensors(const std::string& gguf, const std::string& sqm, F check) {
  const Checkpoint g = load_gguf_checkpoint(gguf);
  const Checkpoint s = sqm_dequantized_checkpoint(sqm);
  for (const auto& [name, t] : s.tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(g.has(name)) << "missing in the GGUF";
    const Tensor& u = g.tensors.at(name);
    ASSERT_EQ(u.shape(), t.shape());
    check(name, u, t);
  }
  EXPECT_EQ(g.tensors.size(), s.tensors.size());
}

std::vector<int32_t> ref_ids(const std::string& arch) {
  std::vector<int32_t> ids = hf_tiny_reference_ids(arch);
  if (ids.size() > 32) ids.resize(32);
  return ids;
}

/// Bound on max |Δlogit| / max |logit| when every weight moves by at most 2⁻¹¹ of its block's
/// largest magnitude (the FP16 rounding of a Q4_1 offset or a Q8_0 scale). Measured (printed by the
/// tests): llama-gqa 1.2e-3 (Q4_1) / 4.2e-4 (Q8_0), qwen2 1.9e-3 / 5.3e-4, Gemma 3 1.5e-2 / 9e-5: these
/// 2-layer random-weight models pass a relative weight error through at a gain of ~2-4; Gemma 3's
/// 6 layers with four norms each, QK-norm and embedding × 8 amplify every rounding ~10x more
/// (tests/hf_tiny_convert_test.cpp, kGemmaFactor). 5e-3 / 5e-2 leave a margin of ~3, while a wrong
/// offset sign, scale or nibble order moves logits by O(1) of their range.
double logit_tolerance(const std::string& arch) { return arch == "gemma3-text" ? 5e-2 : 5e-3; }

struct ExportCase {
  const char* arch;
  const char* gguf_arch;
};

class GgufExportTiny : public ::testing::TestWithParam<ExportCase> {};

// Q4_0: Δ is FP16 in the .sqm and is stored as the block's d unchanged, q + 8 as the nibble, so
// every weight is bit-identical after ggml's dequantization (d·(nibble − 8) in FP32, exact), and
// the model sqkit builds from its own export is the FP32 model of the .sqm's dequantized weights:
// the same values through the same code, hence the same logits bit for bit (tolerance 0).
TEST_P(GgufExportTiny, Q4_0IsExactAndRoundTripsTheLogits) {
  const ExportCase c = GetParam();
  Fixture& fx = fixture();
  const std::string sqm = fx.sym(c.arch), out = fx.dir.file(std::string(c.arch) + "-q4_0.gguf");
  const GgufExportReport rep = export_gguf(sqm, out, {});
  EXPECT_EQ(rep.architecture, c.gguf_arch);
  EXPECT_EQ(rep.file_type, "MOSTLY_Q4_0");
  EXPECT_EQ(rep.file_type_id, 2);
  EXPECT_EQ(rep.max_scale_rounding_rel, 0.0);
  EXPECT_EQ(rep.max_weight_abs_error, 0.0);
  EXPECT_EQ(rep.bytes, fs::file_size(out));
  EXPECT_GT(rep.tensor_types.at("Q4_0"), 0);
  double worst = 0;
  compare_tensors(out, sqm, [&](const std::string&, const Tensor& g, const Tensor& s) {
    for (int64_t i = 0; i < s.numel(); ++i) worst = std::max(worst, std::fabs(double(g.data()[i]) - s.data()[i]));
  });
  EXPECT_EQ(worst, 0.0);

  const GgufFile f(out);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").type, GgmlType::Q4_0);
  EXPECT_EQ(f.tensor("blk.0.attn_norm.weight").type, GgmlType::F32);
  // The default INT8 head of a w4a16 file (FP16-exact row steps): Q8_0, exact too; the embedding is
  // those INT8 rows when tied, and in the linears' INT4 format (Q4_0) when the head is untied.
  const bool untied = f.has_tensor("output.weight");
  EXPECT_EQ(f.tensor("token_embd.weight").type, untied ? GgmlType::Q4_0 : GgmlType::Q8_0);
  if (untied) {
    EXPECT_EQ(f.tensor("output.weight").type, GgmlType::Q8_0);
  }

  const std::vector<int32_t> ids = ref_ids(c.arch);
  const Decoder ref = Decoder::from_checkpoint(sqm_dequantized_checkpoint(sqm));
  const LoadedModel back = load_model(out);
  const std::vector<float> l_ref = decoder_logits(ref, ids), l_back = decoder_logits(*back.model, ids);
  EXPECT_EQ(max_abs_diff(l_ref, l_back), 0.0);
  // The .sqm's own runner (W4A16Linear: same weights, its own GEMM accumulation order).
  const std::vector<float> l_sqm = decoder_logits(*build_model_from_sqm(SqmFile::open(sqm)), ids);
  const double d = max_abs_diff(l_sqm, l_back);
  std::printf("[ %s ] Q4_0 export: |Δlogit| vs the .sqm runner %.3g (max |logit| %.3g)\n", c.arch, d, max_abs(l_sqm));
  EXPECT_LE(d, 1e-4 * max_abs(l_sqm));
}

// Q4_1: x = d·q + m with d = Δ (exact) and m = fp16(−Δ·z). |m − (−Δz)| ≤ 2⁻¹¹·|Δz| (round to nearest,
// normal range; subnormal: ≤ 2⁻²⁵), and ggml's FP32 d·q + m adds one rounding ≤ 2⁻²⁴·|x|. With
// z ≤ 15 and |x| ≤ 15Δ: |x_gguf − x_sqkit| ≤ 15·Δ·(2⁻¹¹ + 2⁻²³) + 2⁻²⁵ per weight, Δ the group's step.
TEST_P(GgufExportTiny, Q4_1IsWithinTheFp16OffsetBound) {
  const ExportCase c = GetParam();
  Fixture& fx = fixture();
  const std::string sqm = fx.asym(c.arch), out = fx.dir.file(std::string(c.arch) + "-q4_1.gguf");
  const GgufExportReport rep = export_gguf(sqm, out, {});
  EXPECT_EQ(rep.file_type, "MOSTLY_Q4_1");
  EXPECT_EQ(rep.file_type_id, 3);
  EXPECT_GT(rep.max_scale_rounding_rel, 0.0);
  EXPECT_LE(rep.max_scale_rounding_rel, std::ldexp(1.0, -11));
  const auto file = SqmFile::open(sqm);
  double worst = 0;
  compare_tensors(out, sqm, [&](const std::string& name, const Tensor& g, const Tensor& s) {
    const int64_t cols = s.shape().back(), rows = s.numel() / cols;
    const std::string scale = name.substr(0, name.size() - 7) + ".weight_scale";
    // INT8 rows (the default w4a16 embedding / head) have FP16-exact steps: Q8_0 holds them exactly.
    const bool int8 = file->has(name) && file->info(name).dtype == SqmDType::I8;
    const bool q = name.ends_with(".weight") && file->has(scale) && !int8;
    const auto* d16 = q ? reinterpret_cast<const uint16_t*>(file->raw(scale).data) : nullptr;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) {
        const double diff = std::fabs(double(g.data()[r * cols + k]) - s.data()[r * cols + k]);
        worst = std::max(worst, diff);
        const double delta = q ? half_to_float(d16[r * (cols / 32) + k / 32]) : 0.0;
        ASSERT_LE(diff, 15 * delta * (std::ldexp(1.0, -11) + std::ldexp(1.0, -23)) + std::ldexp(1.0, -25)) << r << "," << k;
      }
  });
  EXPECT_DOUBLE_EQ(worst, rep.max_weight_abs_error);  // the report measures what ggml dequantizes
  const std::vector<int32_t> ids = ref_ids(c.arch);
  const std::vector<float> l_ref = decoder_logits(Decoder::from_checkpoint(sqm_dequantized_checkpoint(sqm)), ids);
  const std::vector<float> l_back = decoder_logits(*load_model(out).model, ids);
  const double d = max_abs_diff(l_ref, l_back);
  std::printf("[ %s ] Q4_1 export: max |Δw| %.3g (rel %.3g of the block max), FP16 offset rounding %.3g, |Δlogit| %.3g (max |logit| %.3g)\n",
              c.arch, worst, rep.max_weight_rel_error, rep.max_scale_rounding_rel, d, max_abs(l_ref));
  EXPECT_LE(d, logit_tolerance(c.arch) * max_abs(l_ref));
}

// Q8_0: x = d·q, d = fp16(s) per block, s the INT8 step of the row (or tensor). |d − s| ≤ 2⁻¹¹·s
// (+ 2⁻²⁵ subnormal), |q| ≤ 127 and ggml's FP32 product adds ≤ 2⁻²⁴·|x|:
// |x_gguf − x_sqkit| ≤ 127·(s·(2⁻¹¹ + 2⁻²³) + 2⁻²⁵).
TEST_P(GgufExportTiny, Q8_0FromW8A8IsWithinTheFp16ScaleBound) {
  const ExportCase c = GetParam();
  Fixture& fx = fixture();
  const std::string sqm = fx.convert(c.arch, "w8a8-o1", {"--scheme", "w8a8", "--preset", "O1", "--calib", "{calib}"});
  const std::string out = fx.dir.file(std::string(c.arch) + "-q8_0.gguf");
  const GgufExportReport rep = export_gguf(sqm, out, {});
  EXPECT_EQ(rep.file_type, "MOSTLY_Q8_0");
  EXPECT_EQ(rep.file_type_id, 7);
  EXPECT_LE(rep.max_scale_rounding_rel, std::ldexp(1.0, -11));
  const auto file = SqmFile::open(sqm);
  double worst = 0;
  compare_tensors(out, sqm, [&](const std::string& name, const Tensor& g, const Tensor& s) {
    const int64_t cols = s.shape().back(), rows = s.numel() / cols;
    const std::string scale = name.substr(0, name.size() - 7) + ".weight_scale";
    const bool q = name.ends_with(".weight") && file->has(scale);
    std::vector<float> steps;
    if (q) {
      const SqmBytes b = file->raw(scale);
      steps.resize(b.size / 4);
      std::memcpy(steps.data(), b.data, b.size);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const double st = q ? steps[steps.size() == 1 ? 0 : size_t(r)] : 0.0;
      for (int64_t k = 0; k < cols; ++k) {
        const double diff = std::fabs(double(g.data()[r * cols + k]) - s.data()[r * cols + k]);
        worst = std::max(worst, diff);
        ASSERT_LE(diff, 127 * (st * (std::ldexp(1.0, -11) + std::ldexp(1.0, -23)) + std::ldexp(1.0, -25))) << r << "," << k;
      }
    }
  });
  EXPECT_DOUBLE_EQ(worst, rep.max_weight_abs_error);
  const std::vector<int32_t> ids = ref_ids(c.arch);
  const std::vector<float> l_ref = decoder_logits(Decoder::from_checkpoint(sqm_dequantized_checkpoint(sqm)), ids);
  const std::vector<float> l_back = decoder_logits(*load_model(out).model, ids);
  const double d = max_abs_diff(l_ref, l_back);
  std::printf("[ %s ] Q8_0 export: max |Δw| %.3g (rel %.3g), FP16 scale rounding %.3g, |Δlogit| %.3g (max |logit| %.3g)\n", c.arch,
              worst, rep.max_weight_rel_error, rep.max_scale_rounding_rel, d, max_abs(l_ref));
  EXPECT_LE(d, logit_tolerance(c.arch) * max_abs(l_ref));
}

// F32 as stored, and the dequantize option: every tensor F32, equal to the .sqm's dequantized
// weights bit for bit (the oracle target of gguf.quants.dequantize).
TEST_P(GgufExportTiny, F32AndDequantizedExportsAreExact) {
  const ExportCase c = GetParam();
  Fixture& fx = fixture();
  for (const auto& [sqm, opt] : {std::pair{fx.f32(c.arch), GgufExportOptions{}}, std::pair{fx.asym(c.arch), GgufExportOptions{false, true}}}) {
    SCOPED_TRACE(sqm);
    const std::string out = fx.dir.file(fs::path(sqm).stem().string() + (opt.dequantize ? "-deq" : "") + ".gguf");
    const GgufExportReport rep = export_gguf(sqm, out, opt);
    EXPECT_EQ(rep.file_type, "ALL_F32");
    EXPECT_EQ(rep.tensor_types.size(), 1u);
    EXPECT_EQ(rep.tensor_types.count("F32"), 1u);
    double worst = 0;
    compare_tensors(out, sqm, [&](const std::string&, const Tensor& g, const Tensor& s) {
      EXPECT_EQ(std::memcmp(g.data(), s.data(), size_t(s.numel()) * 4), 0);
      worst = std::max(worst, double(std::memcmp(g.data(), s.data(), size_t(s.numel()) * 4) != 0));
    });
    EXPECT_EQ(worst, 0.0);
  }
  // An F32 .sqm runs as DenseLinear: its runner and the export's model are the same computation.
  const std::string f32 = fx.f32(c.arch);
  const std::vector<int32_t> ids = ref_ids(c.arch);
  EXPECT_EQ(max_abs_diff(decoder_logits(*build_model_from_sqm(SqmFile::open(f32)), ids),
                         decoder_logits(*load_model(fx.dir.file(fs::path(f32).stem().string() + ".gguf")).model, ids)),
            0.0);
}

INSTANTIATE_TEST_SUITE_P(, GgufExportTiny,
                         ::testing::Values(ExportCase{"llama-gqa", "llama"}, ExportCase{"qwen2", "qwen2"},
                                           ExportCase{"gemma3-text", "gemma3"}),
                         [](const ::testing::TestParamInfo<ExportCase>& i) {
                           std::string s = i.param.arch;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

TEST(GgufExport, MetadataKeysAndValues) {
  Fixture& fx = fixture();
  const std::string sqm = fx.sym("llama-gqa"), out = fx.dir.file("meta-llama.gguf");
  export_gguf(sqm, out, {});
  const GgufFile f(out);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_string("general.name"), "llama-gqa-w4sym");
  EXPECT_EQ(f.get_u32("general.file_type"), 2u);
  EXPECT_EQ(f.get_u32("general.quantization_version"), 2u);
  EXPECT_EQ(f.get_u32("llama.block_count"), 2u);
  EXPECT_EQ(f.get_u32("llama.context_length"), 256u);
  EXPECT_EQ(f.get_u32("llama.embedding_length"), 64u);
  EXPECT_EQ(f.get_u32("llama.feed_forward_length"), 128u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count"), 4u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count_kv"), 2u);
  EXPECT_EQ(f.get_u32("llama.attention.key_length"), 16u);
  EXPECT_EQ(f.get_u32("llama.rope.dimension_count"), 16u);
  EXPECT_EQ(f.get_u32("llama.vocab_size"), 320u);
  EXPECT_EQ(f.get_f32("llama.attention.layer_norm_rms_epsilon"), 1e-6f);
  EXPECT_EQ(f.get_f32("llama.rope.freq_base"), 10000.0f);
  EXPECT_FALSE(f.has("llama.rope.scaling.type"));
  EXPECT_EQ(f.get_string("sqkit.version"), SQ_VERSION);
  EXPECT_EQ(nlohmann::json::parse(f.get_string("sqkit.recipe")), SqmFile::open(sqm)->header().at("quantization"));
  EXPECT_EQ(f.get_string("sqkit.source.format"), "hf-safetensors");
  EXPECT_EQ(f.get_string("sqkit.source.fingerprint").size(), SqmFile::open(sqm)->header().at("source").at("fingerprint").get<std::string>().size());
  EXPECT_TRUE(f.has_tensor("output.weight"));  // llama-gqa is untied
  // The GGUF rows of q/k are llama.cpp's interleaved order: GGUF row h·d + 2i + j = HF row
  // h·d + j·d/2 + i (d = 16 here), e.g. GGUF row 1 is HF row 8 and GGUF row 18 is HF row 17.
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").dims, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(f.tensor("blk.0.attn_k.weight").dims, (std::vector<int64_t>{64, 32}));
  const Checkpoint deq = sqm_dequantized_checkpoint(sqm);
  for (const auto& [gguf_row, hf_row] : {std::pair{0, 0}, std::pair{1, 8}, std::pair{2, 1}, std::pair{18, 17}, std::pair{31, 31}}) {
    std::vector<float> row(64);
    dequantize_tensor_rows(f, f.tensor("blk.1.attn_k.weight"), gguf_row, gguf_row + 1, row.data());
    const float* want = deq.tensors.at("model.layers.1.self_attn.k_proj.weight").data() + hf_row * 64;
    EXPECT_EQ(std::memcmp(row.data(), want, 64 * 4), 0) << "GGUF row " << gguf_row;
  }

  // qwen2: q/k/v biases, no output permutation; gemma3: sliding window, tied, qk norms.
  const std::string q = fx.dir.file("meta-qwen2.gguf");
  export_gguf(fx.sym("qwen2"), q, {});
  const GgufFile fq(q);
  EXPECT_EQ(fq.get_string("general.architecture"), "qwen2");
  EXPECT_EQ(fq.tensor("blk.1.attn_q.bias").type, GgmlType::F32);
  EXPECT_EQ(fq.tensor("blk.1.attn_k.bias").dims, (std::vector<int64_t>{32}));
  EXPECT_TRUE(fq.has_tensor("blk.1.attn_v.bias"));
  EXPECT_TRUE(load_gguf_checkpoint(q).config.qkv_bias);
  const std::string g = fx.dir.file("meta-gemma3.gguf");
  export_gguf(fx.sym("gemma3-text"), g, {});
  const GgufFile fg(g);
  EXPECT_EQ(fg.get_u32("gemma3.attention.sliding_window"), 16u);
  EXPECT_EQ(fg.get_u32("gemma3.attention.key_length"), 32u);
  EXPECT_EQ(fg.get_f32("gemma3.rope.freq_base"), 1e6f);
  EXPECT_FALSE(fg.has_tensor("output.weight"));
  EXPECT_TRUE(fg.has_tensor("blk.5.attn_q_norm.weight"));
  EXPECT_TRUE(fg.has_tensor("blk.5.post_ffw_norm.weight"));

  // Linear RoPE scaling is written as llama.cpp reads it.
  const std::string r = fx.dir.file("meta-linear-rope.gguf");
  export_gguf(fx.f32("llama-linear-rope"), r, {});
  const GgufFile fr(r);
  EXPECT_EQ(fr.get_string("llama.rope.scaling.type"), "linear");
  EXPECT_EQ(fr.get_f32("llama.rope.scaling.factor"), 4.0f);
  EXPECT_EQ(load_gguf_checkpoint(r).config.rope_scaling.factor, 4.0f);
}

TEST(GgufExport, DropsStaticActivationStepsWithAWarning) {
  Fixture& fx = fixture();
  const std::string sqm = fx.convert("llama-gqa", "w8a8-o3", {"--scheme", "w8a8", "--preset", "O3", "--calib", "{calib}"});
  const GgufExportReport rep = export_gguf(sqm, fx.dir.file("o3.gguf"), {});
  ASSERT_FALSE(rep.warnings.empty());
  bool named = false;
  for (const std::string& w : rep.warnings) named = named || (w.find("input_scale") != std::string::npos && w.find("O3") != std::string::npos);
  EXPECT_TRUE(named) << rep.to_json().dump();
  EXPECT_EQ(GgufFile(fx.dir.file("o3.gguf")).get_array_size("sqkit.export.warnings"), rep.warnings.size());
}

// --quantize-head: the INT8 embedding (tied, Gemma 3) or LM head (untied, llama-gqa) becomes Q8_0;
// BF16 weights stay BF16 (MOSTLY_BF16) with F32 norms; a KV-cache format is dropped with a warning.
TEST(GgufExport, QuantizedHeadBf16AndKvCache) {
  Fixture& fx = fixture();
  const std::vector<std::string> w8 = {"--scheme", "w8a8", "--no-smooth", "--weight", "per-channel",
                                       "--act", "per-token", "--rotate", "none", "--quantize-head"};
  for (const char* arch : {"gemma3-text", "llama-gqa"}) {
    SCOPED_TRACE(arch);
    const std::string sqm = fx.convert(arch, "w8-head", w8), out = fx.dir.file(std::string(arch) + "-head.gguf");
    const GgufExportReport rep = export_gguf(sqm, out, {});
    const GgufFile f(out);
    const bool tied = std::string(arch) == "gemma3-text";
    EXPECT_EQ(f.tensor(tied ? "token_embd.weight" : "output.weight").type, GgmlType::Q8_0);
    EXPECT_EQ(f.has_tensor("output.weight"), !tied);
    compare_tensors(out, sqm, [&](const std::string& name, const Tensor& g, const Tensor& s) {
      double worst = 0, big = 0;
      for (int64_t i = 0; i < s.numel(); ++i) {
        worst = std::max(worst, std::fabs(double(g.data()[i]) - s.data()[i]));
        big = std::max(big, std::fabs(double(s.data()[i])));
      }
      EXPECT_LE(worst, big * (std::ldexp(1.0, -11) + std::ldexp(1.0, -23)) + 127 * std::ldexp(1.0, -25)) << name;
    });
    const std::vector<int32_t> ids = ref_ids(arch);
    const std::vector<float> l_ref = decoder_logits(Decoder::from_checkpoint(sqm_dequantized_checkpoint(sqm)), ids);
    EXPECT_LE(max_abs_diff(l_ref, decoder_logits(*load_model(out).model, ids)), logit_tolerance(arch) * max_abs(l_ref));
  }
  const std::string bf = fx.convert("qwen2", "bf16", {"--scheme", "bf16"}), bf_out = fx.dir.file("qwen2-bf16.gguf");
  const GgufExportReport rb = export_gguf(bf, bf_out, {});
  EXPECT_EQ(rb.file_type, "MOSTLY_BF16");
  EXPECT_EQ(rb.file_type_id, 32);
  const GgufFile fb(bf_out);
  EXPECT_EQ(fb.tensor("blk.0.ffn_up.weight").type, GgmlType::BF16);
  EXPECT_EQ(fb.tensor("blk.0.attn_q.bias").type, GgmlType::F32);
  EXPECT_EQ(fb.tensor("output_norm.weight").type, GgmlType::F32);
  compare_tensors(bf_out, bf, [&](const std::string& name, const Tensor& g, const Tensor& s) {
    EXPECT_EQ(std::memcmp(g.data(), s.data(), size_t(s.numel()) * 4), 0) << name;
  });
  const std::string kv = fx.convert("llama-gqa", "kv-int8", {"--scheme", "f32", "--kv", "int8"});
  const GgufExportReport rk = export_gguf(kv, fx.dir.file("kv.gguf"), {});
  bool named = false;
  for (const std::string& w : rk.warnings) named = named || w.find("KV-cache format") != std::string::npos;
  EXPECT_TRUE(named) << rk.to_json().dump();
  EXPECT_TRUE(GgufFile(fx.dir.file("kv.gguf")).has("sqkit.kv_cache"));
}

// --token-embedding-type int4 (issue 36): the embedding in the linears' INT4 format exports as
// Q4_0 exactly as the linears do (FP16 Δ kept as d, q + 8 as the nibble), so the GGUF's weights are
// the .sqm's dequantized ones bit for bit and sqkit's model of the GGUF gives the dequantized
// model's logits exactly (tolerance 0, as Q4_0IsExactAndRoundTripsTheLogits). Tied (Gemma 3: the
// head is that Q4_0 table) and untied (the head stays INT8 rows: Q8_0).
TEST(GgufExport, Int4TokenEmbeddingIsQ4_0Exactly) {
  Fixture& fx = fixture();
  for (const char* arch : {"gemma3-text", "llama-gqa"}) {
    SCOPED_TRACE(arch);
    const std::string sqm = fx.convert(arch, "w4-emb4", {"--scheme", "w4a16", "--group-size", "32", "--token-embedding-type", "int4"});
    const std::string out = fx.dir.file(std::string(arch) + "-emb4.gguf");
    export_gguf(sqm, out, {});
    const GgufFile f(out);
    EXPECT_EQ(f.tensor("token_embd.weight").type, GgmlType::Q4_0);
    const bool tied = std::string(arch) == "gemma3-text";
    EXPECT_EQ(f.has_tensor("output.weight"), !tied);
    if (!tied) {
      EXPECT_EQ(f.tensor("output.weight").type, GgmlType::Q8_0);
    }
    double worst = 0;
    compare_tensors(out, sqm, [&](const std::string&, const Tensor& g, const Tensor& s) {
      for (int64_t i = 0; i < s.numel(); ++i) worst = std::max(worst, std::fabs(double(g.data()[i]) - s.data()[i]));
    });
    EXPECT_EQ(worst, 0.0);
    const std::vector<int32_t> ids = ref_ids(arch);
    const std::vector<float> l_ref = decoder_logits(Decoder::from_checkpoint(sqm_dequantized_checkpoint(sqm)), ids);
    EXPECT_EQ(max_abs_diff(l_ref, decoder_logits(*load_model(out).model, ids)), 0.0);
    // The .sqm's own runner: the same embedding rows (looked up, not a GEMM) and W4A16 linears.
    const std::vector<float> l_sqm = decoder_logits(*build_model_from_sqm(SqmFile::open(sqm)), ids);
    EXPECT_LE(max_abs_diff(l_sqm, l_ref), 1e-4 * max_abs(l_ref));
  }
}

/// A byte-level BPE tokenizer.json of `n_tokens` ids (≤ 320, the tiny models' vocabulary): the 256
/// byte-level characters, letter-pair merges, "<|endoftext|>" last (special: BOS and EOS).
std::string synthetic_tokenizer_json(int n_tokens) {
  nlohmann::json vocab = nlohmann::json::object(), merges = nlohmann::json::array();
  std::vector<std::string> tok;
  for (int b = 0; b < 256; ++b) tok.push_back(byte_level_char(uint8_t(b)));
  std::set<std::string> seen(tok.begin(), tok.end());
  const std::string letters = "etaoinshrdlucmfwypvbgkjqxz";
  for (size_t i = 0; int(tok.size()) < n_tokens - 1 && i < 26 * 26; ++i) {  // letter pairs "ee", "et", ...
    const std::string a(1, letters[i / 26]), b(1, letters[i % 26]);
    if (!seen.insert(a + b).second) continue;
    merges.push_back(a + " " + b);
    tok.push_back(a + b);
  }
  for (size_t i = 0; i < tok.size(); ++i) vocab[tok[i]] = i;
  const int eot = int(tok.size());
  vocab["<|endoftext|>"] = eot;
  nlohmann::json j = {{"version", "1.0"},
                      {"added_tokens", {{{"id", eot}, {"content", "<|endoftext|>"}, {"special", true}, {"single_word", false},
                                         {"lstrip", false}, {"rstrip", false}, {"normalized", false}}}},
                      {"normalizer", nullptr},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
                      {"post_processor", nullptr},
                      {"decoder", {{"type", "ByteLevel"}}},
                      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  return j.dump();
}

// An HF-sourced .sqm with a tokenizer.json: written as llama.cpp's gpt2 tokenizer keys, which
// sqkit's GGUF tokenizer reads back to the same token ids as the tokenizer.json; ids the embedding
// has beyond the tokenizer are padded "[PAD<id>]" (UNUSED), as convert_hf_to_gguf.py does.
TEST(GgufExport, ConvertsAByteLevelBpeTokenizerJson) {
  Fixture& fx = fixture();
  const std::string json_path = fx.dir.file("tokenizer.json");
  write_file(json_path, synthetic_tokenizer_json(300));
  const std::string sqm = fx.convert("llama-gqa", "tok", {"--scheme", "f32", "--tokenizer", json_path});
  ASSERT_EQ(SqmFile::open(sqm)->header().at("tokenizer").at("format"), "hf-json");
  const std::string out = fx.dir.file("tok.gguf");
  const GgufExportReport rep = export_gguf(sqm, out, {});
  EXPECT_TRUE(rep.warnings.empty()) << rep.to_json().dump();
  const GgufFile f(out);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "gpt-2");
  const std::vector<std::string> tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 320u);
  EXPECT_EQ(tokens[300], "[PAD300]");
  EXPECT_EQ(f.get_i32_array("tokenizer.ggml.token_type")[299], 3);  // <|endoftext|>: control
  EXPECT_EQ(f.get_i32_array("tokenizer.ggml.token_type")[300], 5);  // padding: unused
  const std::string text = read_file(json_path);
  const auto ref = load_tokenizer_from_bytes(reinterpret_cast<const uint8_t*>(text.data()), text.size(), json_path);
  const auto back = load_gguf_tokenizer(f);
  for (const std::string& s : {std::string("the rain in spain stays mainly"), std::string("Hello, wörld! 123 <|endoftext|> tea")})
    EXPECT_EQ(back->encode(s, false, false), ref->encode(s, false, false)) << s;
  EXPECT_EQ(back->eos_id(), ref->eos_id());
  EXPECT_EQ(back->bos_id(), ref->bos_id());
}

/// Copies `src` to `dst` with its header changed by `edit` (tensors unchanged).
template <typename F>
void rewrite_sqm(const std::string& src, const std::string& dst, F edit) {
  const auto in = SqmFile::open(src);
  SqmWriter w(dst);
  for (const SqmTensorInfo& t : in->tensors()) {
    const SqmBytes b = in->raw(t.name);
    w.add_tensor(t.name, t.dtype, t.shape, b.data, b.size);
  }
  nlohmann::json h = in->header();
  edit(h);
  w.finish(h);
}

/// Runs the export, expecting `E` with `parts` in its message and nothing left in the directory of
/// `out` that was not there before.
template <typename E>
void expect_refused(const std::string& sqm, const std::string& out, const std::vector<std::string>& parts, GgufExportOptions opt = {}) {
  SCOPED_TRACE(sqm);
  const fs::path dir = fs::path(out).parent_path();
  size_t before = 0, after = 0;
  for (auto it = fs::directory_iterator(dir); it != fs::directory_iterator(); ++it) ++before;
  const bool existed = fs::exists(out);
  expect_error<E>([&] { export_gguf(sqm, out, opt); }, parts);
  for (auto it = fs::directory_iterator(dir); it != fs::directory_iterator(); ++it) ++after;
  EXPECT_EQ(after, before);
  EXPECT_EQ(fs::exists(out), existed);
}

TEST(GgufExport, RefusesWhatGgufCannotExpressAndWritesNothing) {
  Fixture& fx = fixture();
  ScratchDir out_dir;
  const std::string out = out_dir.file("x.gguf");
  // Atom W4A4 (the scheme is refused before anything else is read).
  const std::string atom = fx.dir.file("atom.sqm");
  rewrite_sqm(fx.sym("llama-gqa"), atom, [](nlohmann::json& h) { h["quantization"]["scheme"] = "w4a4-atom"; });
  expect_refused<UnsupportedError>(atom, out, {"w4a4-atom", "no GGUF export"});
  // INT4 group size 16.
  const std::string g16 = fx.dir.file("g16.sqm");
  rewrite_sqm(fx.sym("llama-gqa"), g16, [](nlohmann::json& h) { h["quantization"]["group_size"] = 16; });
  expect_refused<UnsupportedError>(g16, out, {"group size 16", "multiple of 32"});
  // Architectures without a mapping, and Mistral's sliding window.
  expect_refused<UnsupportedError>(fx.convert("opt", "f32", {"--scheme", "f32"}), out,
                                   {"architecture 'opt' has no GGUF export (expected llama, qwen2 or gemma3)"});
  expect_refused<UnsupportedError>(fx.convert("mistral-sliding-window", "f32", {"--scheme", "f32"}), out,
                                   {"'mistral'", "sliding window of 16 tokens", "context of 256"});
  // An existing output without force: untouched; with force: replaced.
  write_file(out, "keep me");
  expect_refused<UsageError>(fx.sym("llama-gqa"), out, {out + " already exists (use --force to overwrite it)"});
  EXPECT_EQ(read_file(out), "keep me");
  GgufExportOptions force;
  force.force = true;
  export_gguf(fx.sym("llama-gqa"), out, force);
  EXPECT_EQ(GgufFile(out).get_string("general.architecture"), "llama");
  // Never the input, even with force.
  const std::string copy = out_dir.file("in.sqm");
  fs::copy_file(fx.sym("llama-gqa"), copy);
  expect_refused<UsageError>(copy, copy, {"is the input"}, force);
  EXPECT_NO_THROW(SqmFile::open(copy));
}

// The tool: sq-export --format gguf [--outtype f32] writes what export_gguf writes; bad input is one
// line on stderr, exit 2, nothing written.
TEST(GgufExport, SqExportToolWritesGgufAndRefusesBadInput) {
  Fixture& fx = fixture();
  ScratchDir out_dir;
  const std::string sym = fx.sym("qwen2");
  const std::string out = out_dir.file("q.gguf"), f32 = out_dir.file("q-f32.gguf");
  ProcessResult r = run_process({tool("sq-export"), sym, "--format", "gguf", "-o", out});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NE(r.out.find("file type MOSTLY_Q4_0"), std::string::npos) << r.out;
  r = run_process({tool("sq-export"), sym, "--format", "gguf", "--outtype", "f32", "-o", f32, "--json", out_dir.file("s.json")});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(read_file(out_dir.file("s.json")))["gguf"]["file_type"], "ALL_F32");
  // The Q4_0 file dequantizes to the F32 file's values exactly (symmetric INT4 codes, FP16 steps).
  const Checkpoint q = load_gguf_checkpoint(out), f = load_gguf_checkpoint(f32);
  const std::string w = "model.layers.1.mlp.down_proj.weight";
  const Tensor& tq = q.tensors.at(w);
  const Tensor& tf = f.tensors.at(w);
  ASSERT_EQ(tq.numel(), tf.numel());
  EXPECT_EQ(std::memcmp(tq.data(), tf.data(), size_t(tq.numel()) * 4), 0);
  // Bad input: each one line, exit 2, the existing file untouched / nothing new written.
  write_file(out_dir.file("keep.gguf"), "keep");
  for (const std::vector<std::string>& bad : {
           std::vector<std::string>{sym, "--format", "gguf", "-o", out_dir.file("keep.gguf")},                 // exists, no --force
           std::vector<std::string>{sym, "--format", "gguf", "--outtype", "q5_k", "-o", out_dir.file("a.gguf")},  // unknown outtype
           std::vector<std::string>{sym, "--format", "hf", "--outtype", "f32", "-o", out_dir.file("b")},          // gguf-only option
           std::vector<std::string>{fx.convert("opt", "f32", {"--scheme", "f32"}), "--format", "gguf", "-o", out_dir.file("c.gguf")}}) {
    std::vector<std::string> argv = {tool("sq-export")};
    argv.insert(argv.end(), bad.begin(), bad.end());
    const ProcessResult e = run_process(argv);
    EXPECT_EQ(e.exit_status, 2) << e.err;
    EXPECT_EQ(std::count(e.err.begin(), e.err.end(), '\n'), 1) << e.err;
  }
  EXPECT_EQ(read_file(out_dir.file("keep.gguf")), "keep");
  for (const char* name : {"a.gguf", "b", "c.gguf"}) EXPECT_FALSE(fs::exists(out_dir.file(name))) << name;
}

// A llama2.c-sourced .sqm (stories260K) holds q/k rows in the interleaved order already: written
// unpermuted, read back by the GGUF reader restored to half-split — the same function. Its FFN
// width 172 is not a multiple of 32: W4A16 exports only dequantized to F32.
TEST(GgufExport, Llama2cSourceAndRaggedRowsDequantized) {
  ScratchDir dir;
  const std::string f32 = dir.file("s-f32.sqm"), w4 = dir.file("s-w4.sqm");
  for (const auto& [out, scheme] : {std::pair{f32, "f32"}, std::pair{w4, "w4a16"}}) {
    std::vector<std::string> argv = {tool("sq-convert"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-o", out, "-q",
                                     "-t", "2", "--scheme", scheme};
    if (out == w4) argv.insert(argv.end(), {"--group-size", "32"});
    const ProcessResult r = run_process(argv);
    ASSERT_EQ(r.exit_status, 0) << r.err;
  }
  const GgufExportReport rep = export_gguf(f32, dir.file("s.gguf"), {});
  ASSERT_EQ(rep.warnings.size(), 1u);
  EXPECT_NE(rep.warnings[0].find("'llama2c' tokenizer"), std::string::npos) << rep.warnings[0];
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 90, 259, 300, 429, 268, 505, 275, 1, 32, 64, 128};
  const std::vector<float> a = decoder_logits(*build_model_from_sqm(SqmFile::open(f32)), ids);
  const std::vector<float> b = decoder_logits(*load_model(dir.file("s.gguf")).model, ids);
  // Same weights, the same RoPE rotations; a head's q·k products are summed in another order.
  EXPECT_LE(max_abs_diff(a, b), 1e-5 * max_abs(a));
  expect_refused<UnsupportedError>(w4, dir.file("w4.gguf"), {"rows of 172 weights, not a multiple of 32"});
  GgufExportOptions deq;
  deq.dequantize = true;
  export_gguf(w4, dir.file("w4.gguf"), deq);
  const std::vector<float> c = decoder_logits(*build_model_from_sqm(SqmFile::open(w4)), ids);
  const std::vector<float> d = decoder_logits(*load_model(dir.file("w4.gguf")).model, ids);
  std::printf("[ stories260K ] f32 export |Δlogit| %.3g, W4A16 dequantized export |Δlogit| %.3g (max |logit| %.3g)\n", max_abs_diff(a, b),
              max_abs_diff(c, d), max_abs(c));
  EXPECT_LE(max_abs_diff(c, d), 1e-4 * max_abs(c));  // W4A16 kernel (padded ragged groups) vs FP32 dense
}

// The streaming writer alone: infos, alignment padding and data bytes read back by GgufFile; the
// temporary never survives a failure; bad specs are refused before anything is created.
TEST(GgufStreamWriter, WritesAlignedTensorsAndNothingOnFailure) {
  ScratchDir dir;
  const std::string out = dir.file("w.gguf");
  GgufValue name;
  name.type = GgufValueType::STRING;
  name.str = "x";
  const std::vector<std::pair<std::string, const GgufValue*>> kvs = {{"general.name", &name}};
  std::vector<GgufTensorSpec> specs = {{"a", {3}, GgmlType::F32}, {"b", {32, 2}, GgmlType::Q8_0}, {"c", {5}, GgmlType::F16}};
  {
    GgufStreamWriter w(out, kvs, specs);
    const float a[3] = {1, 2, 3};
    w.write_next(a, sizeof a);
    std::vector<uint8_t> b(68);
    for (size_t i = 0; i < b.size(); ++i) b[i] = uint8_t(i);
    EXPECT_THROW(w.write_next(b.data(), 67), std::logic_error);
    w.write_next(b.data(), b.size());
    const uint16_t c[5] = {0x3c00, 0x4000, 0, 0x8000, 0x3555};
    w.write_next(c, sizeof c);
    w.finish();
  }
  const GgufFile f(out);
  EXPECT_EQ(f.get_string("general.name"), "x");
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensor("a").offset, 0u);
  EXPECT_EQ(f.tensor("b").offset, 32u);   // 12 bytes padded to 32
  EXPECT_EQ(f.tensor("c").offset, 128u);  // 68 bytes padded to 96
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.tensor_data(f.tensor("b"))[67], 67);
  EXPECT_EQ(std::memcmp(f.tensor_data(f.tensor("c")), "\x00\x3c\x00\x40", 4), 0);
  // Destroyed before finish(): no output, no temporary.
  const std::string partial = dir.file("p.gguf");
  { GgufStreamWriter w(partial, kvs, specs); }
  EXPECT_FALSE(fs::exists(partial));
  size_t files = 0;
  for (auto it = fs::directory_iterator(dir.path()); it != fs::directory_iterator(); ++it) ++files;
  EXPECT_EQ(files, 1u);
  specs[1].dims = {31, 2};  // not a whole number of Q8_0 blocks
  EXPECT_THROW(GgufStreamWriter(dir.file("bad.gguf"), kvs, specs), InputError);
  specs[1] = {"a", {32}, GgmlType::F32};  // duplicated name
  EXPECT_THROW(GgufStreamWriter(dir.file("bad.gguf"), kvs, specs), InputError);
  EXPECT_FALSE(fs::exists(dir.file("bad.gguf")));
}

// SmolLM2-135M (GGUF Q4_1/Q8_0 source) -> sq-convert W4A16 g32 symmetric -> GGUF Q4_0 -> sqkit.
TEST(GgufExportSmolLM2, W4A16SymRoundTripsThroughQ4_0) {
  const std::string src = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (src.empty()) GTEST_SKIP() << "SmolLM2-135M-Instruct.Q4_1.gguf not found (bash scripts/fetch-models.sh smollm2-135m)";
  ScratchDir dir;
  const std::string sqm = dir.file("smol-w4.sqm"), out = dir.file("smol-q4_0.gguf");
  const ProcessResult r = run_process({tool("sq-convert"), "-m", src, "-o", sqm, "-q", "--scheme", "w4a16", "--sym", "--group-size", "32", "-t", "2"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const GgufExportReport rep = export_gguf(sqm, out, {});
  EXPECT_EQ(rep.file_type, "MOSTLY_Q4_0");
  EXPECT_TRUE(rep.warnings.empty()) << rep.to_json().dump();
  const GgufFile f(out);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_array_size("tokenizer.ggml.tokens"), 49152u);
  std::vector<int32_t> ids(16);
  std::mt19937 rng(135);
  for (auto& id : ids) id = int32_t(rng() % 49152u);
  const std::vector<float> l_sqm = decoder_logits(*build_model_from_sqm(SqmFile::open(sqm)), ids);
  const LoadedModel back = load_model(out);
  const std::vector<float> l_back = decoder_logits(*back.model, ids);
  const int64_t V = back.model->config().vocab_size;
  int agree = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* a = l_sqm.data() + t * size_t(V);
    const float* b = l_back.data() + t * size_t(V);
    agree += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
  }
  const double d = max_abs_diff(l_sqm, l_back);
  std::printf("[ SmolLM2 ] W4A16 g32 sym -> Q4_0 (%.1f MB): argmax %d/16, max |Δlogit| %.3g (max |logit| %.3g)\n", rep.bytes / 1e6, agree,
              d, max_abs(l_sqm));
  EXPECT_EQ(agree, 16);
  // Same weights (exact Q4_0), the .sqm runner's W4A16 kernel vs the FP32 DenseLinear of the GGUF
  // model: only the summation order of 30 layers differs.
  EXPECT_LE(d, 1e-3 * max_abs(l_sqm));
}

// SmolLM2-135M -> sq-convert --k-quant -> GGUF: the 1536-wide down projections as Q4_K blocks (the
// stored super-block heads, codes regrouped), the 576-wide linears as Q4_1 (their K-quant Δ and m
// are FP16 values): every weight read back by sqkit's GGUF reader (its Q4_K / Q4_1 dequantization,
// written from ggml-common.h) equals the .sqm's exactly (tolerance 0).
TEST(GgufExportSmolLM2, KQuantIsQ4_KAndQ4_1Exactly) {
  const std::string src = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (src.empty()) GTEST_SKIP() << "SmolLM2-135M-Instruct.Q4_1.gguf not found (bash scripts/fetch-models.sh smollm2-135m)";
  ScratchDir dir;
  const std::string sqm = dir.file("smol-q4k.sqm"), out = dir.file("smol-q4k.gguf");
  const ProcessResult r = run_process({tool("sq-convert"), "-m", src, "-o", sqm, "-q", "--scheme", "w4a16", "--k-quant", "-t", "2"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const GgufExportReport rep = export_gguf(sqm, out, {});
  EXPECT_EQ(rep.max_weight_abs_error, 0.0);
  EXPECT_EQ(rep.max_scale_rounding_rel, 0.0);
  const GgufFile f(out);
  EXPECT_EQ(f.tensor("blk.0.ffn_down.weight").type, GgmlType::Q4_K);
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").type, GgmlType::Q4_1);
  EXPECT_EQ(f.tensor("blk.29.ffn_up.weight").type, GgmlType::Q4_1);
  double worst = 0;
  compare_tensors(out, sqm, [&](const std::string&, const Tensor& g, const Tensor& s) {
    for (int64_t i = 0; i < s.numel(); ++i) worst = std::max(worst, std::fabs(double(g.data()[i]) - s.data()[i]));
  });
  EXPECT_EQ(worst, 0.0);
}

}  // namespace
}  // namespace sq::test
