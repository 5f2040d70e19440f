// RoPE scaling (issue 14 point 1): the Llama RoPE variants of ../shared/data/reference/hf-tiny run
// exactly as transformers runs them, RoPE settings are read from both `rope_parameters`
// (transformers >= 5) and the legacy `rope_scaling` + `rope_theta`, and every other RoPE setting
// is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rope_frequencies.h"
#include "formats/fingerprint.h"
#include "formats/hf_checkpoint.h"
#include "formats/hf_config.h"
#include "formats/safetensors.h"
#include "formats/sqm_file.h"
#include "model/decoder_backward.h"
#include "model/model_loader.h"
#include "model/sqm_model.h"
#include "runtime/kv_cache.h"
#include "tests/support/cli.h"
#include "tests/support/expect_error.h"
#include "tests/support/process.h"
#include "tests/support/test_data.h"

namespace sq::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string tiny(const std::string& name) { return shared_data("reference/hf-tiny/" + name); }

/// transformers' FP32 reference of an hf-tiny model: input_ids [T] and logits [T, vocab].
struct Reference {
  std::vector<int32_t> ids;
  Tensor logits;
};

Reference load_reference(const std::string& name) {
  SafetensorsFile ref(tiny(name) + "/reference.safetensors");
  EXPECT_EQ(ref.dtype("input_ids"), "I32");
  Reference r;
  r.ids.resize(static_cast<size_t>(ref.shape("input_ids").at(0)));
  std::memcpy(r.ids.data(), ref.raw_data("input_ids"), r.ids.size() * sizeof(int32_t));
  r.logits = ref.load_f32("logits");
  return r;
}

/// Logits [T, vocab] of `model` over `ids`: one prefill block of the first `prefill` tokens (all
/// when 0), then one decode step per remaining token, through a KV cache of format `spec`.
std::vector<float> run(const Decoder& model, const std::vector<int32_t>& ids, int64_t prefill = 0, KVSpec spec = {}) {
  const int64_t n = static_cast<int64_t>(ids.size()), vocab = model.config().vocab_size;
  if (prefill <= 0) prefill = n;
  KVCache cache(model.config(), n, spec);
  Workspace ws;
  std::vector<float> logits(static_cast<size_t>(n * vocab));
  model.forward(ids.data(), prefill, cache, ws, logits.data(), LogitsFor::AllTokens);
  for (int64_t t = prefill; t < n; ++t) model.forward(ids.data() + t, 1, cache, ws, logits.data() + t * vocab, LogitsFor::AllTokens);
  return logits;
}

struct LogitDiff {
  double max_abs = 0.0;     ///< max |Δlogit| over every position and vocabulary entry
  int argmax_mismatch = 0;  ///< positions whose argmax differs
};

template <typename A, typename B>
LogitDiff compare(const A* a, const B* b, int64_t n, int64_t vocab) {
  LogitDiff d;
  for (int64_t t = 0; t < n; ++t) {
    const A* x = a + t * vocab;
    const B* y = b + t * vocab;
    for (int64_t v = 0; v < vocab; ++v) d.max_abs = std::max(d.max_abs, std::fabs(double(x[v]) - double(y[v])));
    if (std::max_element(x, x + vocab) - x != std::max_element(y, y + vocab) - y) ++d.argmax_mismatch;
  }
  return d;
}

LogitDiff compare_with_reference(const Decoder& model, const std::string& name, int64_t prefill = 0, KVSpec spec = {}) {
  const Reference ref = load_reference(name);
  const int64_t n = static_cast<int64_t>(ref.ids.size()), vocab = model.config().vocab_size;
  EXPECT_EQ(ref.logits.shape(), (std::vector<int64_t>{n, vocab}));
  const std::vector<float> logits = run(model, ref.ids, prefill, spec);
  return compare(logits.data(), ref.logits.data(), n, vocab);
}

// Both sides compute in FP32 from the same FP32 weights; they differ only in summation order
// (sgemm blocking vs PyTorch's kernels) and in cos/sin/exp implementations, i.e. by a few FP32 ulps
// per operation, amplified through 2 layers. Logits here are O(1) (|logit| < 3): the default-RoPE
// model agrees to ~2e-6 and the scaled ones to ~3e-6, so 1e-4 leaves a factor 30 of slack for
// rounding, while any RoPE frequency error is far outside it (plain RoPE on the scaled models
// misses by 1.25 and 1.98).
constexpr double kLogitTol = 1e-4;

class HfTinyRope : public ::testing::TestWithParam<const char*> {};

TEST_P(HfTinyRope, LogitsMatchTransformers) {
  const LoadedModel m = load_model(tiny(GetParam()));
  const LogitDiff d = compare_with_reference(*m.model, GetParam());
  std::printf("[ measured ] %s: max |dlogit| = %.3g, %d argmax mismatches\n", GetParam(), d.max_abs, d.argmax_mismatch);
  EXPECT_LT(d.max_abs, kLogitTol);
  EXPECT_EQ(d.argmax_mismatch, 0);
}

// Decode steps read earlier keys back from the cache; a pre-RoPE cache rotates them after reading
// (KVCache::read with the cache's rope_inv_freq), so the scaled frequencies must reach it too.
TEST_P(HfTinyRope, DecodeThroughPreRopeCacheMatchesTransformers) {
  const LoadedModel m = load_model(tiny(GetParam()));
  KVSpec pre;
  pre.keys = KVKeyRope::PreRope;
  const LogitDiff d = compare_with_reference(*m.model, GetParam(), /*prefill=*/40, pre);
  std::printf("[ measured ] %s, prefill 40 + decode, fp32 pre-RoPE keys: max |dlogit| = %.3g\n", GetParam(), d.max_abs);
  EXPECT_LT(d.max_abs, kLogitTol);
  EXPECT_EQ(d.argmax_mismatch, 0);
}

// The Fisher backward pass (decoder_backward.cpp) has its own RoPE, in double for T = double.
TEST_P(HfTinyRope, BackwardPassForwardMatchesTransformers) {
  const LoadedModel m = load_model(tiny(GetParam()));
  const Reference ref = load_reference(GetParam());
  const int64_t n = static_cast<int64_t>(ref.ids.size());
  std::vector<double> logits;
  DecoderKVBackward<double>(*m.model).loss(ref.ids.data(), n, nullptr, &logits);
  ASSERT_EQ(static_cast<int64_t>(logits.size()), ref.logits.numel());
  const LogitDiff d = compare(logits.data(), ref.logits.data(), n, m.model->config().vocab_size);
  EXPECT_LT(d.max_abs, kLogitTol);  // FP64 here, FP32 in transformers: the same rounding budget
  EXPECT_EQ(d.argmax_mismatch, 0);
}

INSTANTIATE_TEST_SUITE_P(Llama, HfTinyRope, ::testing::Values("llama-gqa", "llama-linear-rope", "llama3-rope-scaled"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// The reference tests can fail: the same weights run as plain RoPE (what sqkit did before it read
// rope_parameters) are far from transformers' logits.
TEST(HfTinyRopeControl, ScaledModelsRunAsPlainRopeMissTheReference) {
  for (const char* name : {"llama-linear-rope", "llama3-rope-scaled"}) {
    Checkpoint ck = load_hf_checkpoint(tiny(name));
    ASSERT_FALSE(ck.config.rope_scaling.is_default()) << name;
    ck.config.rope_scaling = RopeScaling{};
    const LogitDiff d = compare_with_reference(Decoder::from_checkpoint(ck), name);
    std::printf("[ measured ] %s as plain RoPE: max |dlogit| = %.3g, %d argmax mismatches\n", name, d.max_abs, d.argmax_mismatch);
    EXPECT_GT(d.max_abs, 0.5) << name;
    EXPECT_GT(d.argmax_mismatch, 10) << name;
  }
}

// ---- rope_inv_freq against the definitions -------------------------------------------------------

/// θ^(−2i/d) in double.
double plain(double theta, int i, int d) { return std::pow(theta, -2.0 * i / d); }

TEST(RopeInvFreq, DefaultAndLinear) {
  RopeScaling linear;
  linear.type = RopeScalingType::Linear;
  linear.factor = 4.0f;
  const auto a = rope_inv_freq<float>(10000.0f, 16, RopeScaling{});
  const auto b = rope_inv_freq<float>(10000.0f, 16, linear);
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    // FP32 pow and division: within 4 float ulps (2^-21 relative) of the exact value.
    EXPECT_NEAR(a[size_t(i)], plain(1e4, i, 16), plain(1e4, i, 16) * 0x1p-21) << i;
    EXPECT_EQ(b[size_t(i)], a[size_t(i)] / 4.0f) << i;  // linear: inv_freq / factor, exactly
  }
  EXPECT_EQ(a[0], 1.0f);
}

// Llama 3.1's interpolation, written out from the definition (wavelength λ = 2π/inv_freq; L the
// original context): λ < L/high_freq_factor keeps inv_freq, λ > L/low_freq_factor divides it by
// factor, in between s = (L/λ − low)/(high − low) blends (1 − s)·inv/factor + s·inv.
TEST(RopeInvFreq, Llama3MatchesTheDefinition) {
  struct Case {
    float theta;
    int head_dim;
    float factor, low, high;
    int context;
  };
  // hf-tiny llama3-rope-scaled, and Llama 3.1 8B (θ 500000, head_dim 128, factor 8, L 8192).
  for (const Case& k : {Case{1e4f, 16, 8.0f, 1.0f, 4.0f, 32}, Case{5e5f, 128, 8.0f, 1.0f, 4.0f, 8192}}) {
    RopeScaling s;
    s.type = RopeScalingType::Llama3;
    s.factor = k.factor;
    s.low_freq_factor = k.low;
    s.high_freq_factor = k.high;
    s.original_max_position_embeddings = k.context;
    const auto got = rope_inv_freq<float>(k.theta, k.head_dim, s);
    const auto got64 = rope_inv_freq<double>(k.theta, k.head_dim, s);
    int kept = 0, divided = 0, blended = 0;
    for (int i = 0; i < k.head_dim / 2; ++i) {
      const double inv = plain(k.theta, i, k.head_dim), lambda = 2 * M_PI / inv;
      double want;
      if (lambda < k.context / k.high) {
        want = inv;
        ++kept;
      } else if (lambda > k.context / k.low) {
        want = inv / k.factor;
        ++divided;
      } else {
        const double sm = (k.context / lambda - k.low) / (k.high - k.low);
        want = (1 - sm) * inv / k.factor + sm * inv;
        ++blended;
      }
      // FP32: a handful of roundings, each ≤ 2^-24 relative; 2^-20 bounds them with margin.
      EXPECT_NEAR(got[size_t(i)], want, want * 0x1p-20) << "theta " << k.theta << " pair " << i;
      EXPECT_NEAR(got64[size_t(i)], want, want * 1e-12) << "theta " << k.theta << " pair " << i;
    }
    // Every regime is exercised by both cases.
    EXPECT_GT(kept, 0);
    EXPECT_GT(divided, 0);
    EXPECT_GT(blended, 0);
  }
}

// ---- config.json ---------------------------------------------------------------------------------

json tiny_config(const std::string& name) { return json::parse(read_file(tiny(name) + "/config.json")); }

TEST(HfRopeConfig, ReadsRopeParameters) {
  const ModelConfig l3 = parse_hf_config(tiny_config("llama3-rope-scaled"), "c.json");
  EXPECT_EQ(l3.rope_scaling.type, RopeScalingType::Llama3);
  EXPECT_EQ(l3.rope_scaling.factor, 8.0f);
  EXPECT_EQ(l3.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(l3.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(l3.rope_scaling.original_max_position_embeddings, 32);
  EXPECT_EQ(l3.rope_theta, 10000.0f);
  const ModelConfig lin = parse_hf_config(tiny_config("llama-linear-rope"), "c.json");
  EXPECT_EQ(lin.rope_scaling.type, RopeScalingType::Linear);
  EXPECT_EQ(lin.rope_scaling.factor, 4.0f);
  EXPECT_TRUE(parse_hf_config(tiny_config("llama-gqa"), "c.json").rope_scaling.is_default());
}

// transformers >= 5 keeps θ only in rope_parameters; it used to be ignored (θ = 10000 ran).
TEST(HfRopeConfig, RopeParametersThetaIsUsed) {
  json j = tiny_config("llama-gqa");
  j["rope_parameters"]["rope_theta"] = 500000.0;
  const ModelConfig c = parse_hf_config(j, "c.json");
  EXPECT_EQ(c.rope_theta, 500000.0f);
  EXPECT_FLOAT_EQ(rope_inv_freq(c)[1], float(plain(5e5, 1, 16)));

  // End to end: the directory with θ = 500000 runs with it, so its logits leave the θ = 10000
  // reference, and equal those of the θ = 10000 checkpoint given θ = 500000 in memory.
  ScratchDir dir;
  fs::create_directories(dir.file("m"));
  write_file(dir.file("m/config.json"), j.dump());
  fs::create_symlink(tiny("llama-gqa") + "/model.safetensors", dir.file("m/model.safetensors"));
  const LoadedModel m = load_model(dir.file("m"));
  EXPECT_EQ(m.model->config().rope_theta, 500000.0f);
  EXPECT_GT(compare_with_reference(*m.model, "llama-gqa").max_abs, 1e-2);
  Checkpoint ck = load_hf_checkpoint(tiny("llama-gqa"));
  ck.config.rope_theta = 500000.0f;
  const Reference ref = load_reference("llama-gqa");
  EXPECT_EQ(run(*m.model, ref.ids), run(Decoder::from_checkpoint(ck), ref.ids));
}

// transformers < 5 configs: legacy rope_scaling (rope_type or type) + top-level rope_theta.
TEST(HfRopeConfig, LegacyRopeScalingReadsTheSame) {
  for (const char* name : {"llama3-rope-scaled", "llama-linear-rope"}) {
    json j = tiny_config(name);
    json rs = j["rope_parameters"];
    j.erase("rope_parameters");
    j["rope_theta"] = rs["rope_theta"];
    rs.erase("rope_theta");
    j["rope_scaling"] = rs;
    const ModelConfig a = parse_hf_config(tiny_config(name), "c.json"), b = parse_hf_config(j, "c.json");
    EXPECT_TRUE(a.rope_scaling == b.rope_scaling) << name;
    EXPECT_EQ(a.rope_theta, b.rope_theta) << name;
    // The pre-4.43 spelling "type".
    j["rope_scaling"]["type"] = j["rope_scaling"]["rope_type"];
    j["rope_scaling"].erase("rope_type");
    EXPECT_TRUE(parse_hf_config(j, "c.json").rope_scaling == a.rope_scaling) << name;
    // Both keys present and saying the same thing is fine.
    j["rope_parameters"] = tiny_config(name)["rope_parameters"];
    EXPECT_TRUE(parse_hf_config(j, "c.json").rope_scaling == a.rope_scaling) << name;
  }
}

TEST(HfRopeConfig, UnsupportedRopeTypesRefusedByName) {
  for (const char* type : {"dynamic", "yarn", "longrope", "su", "proportional"}) {
    json j = tiny_config("llama3-rope-scaled");
    j["rope_parameters"]["rope_type"] = type;
    expect_error<UnsupportedError>([&] { parse_hf_config(j, "c.json"); },
                                   {"c.json: rope_parameters.rope_type = '" + std::string(type) +
                                    "' is not supported (expected 'default', 'linear' or 'llama3'"});
  }
  json j = tiny_config("llama-gqa");
  j.erase("rope_parameters");
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  expect_error<UnsupportedError>([&] { parse_hf_config(j, "c.json"); }, {"c.json: rope_scaling.type = 'dynamic' is not supported"});
}

TEST(HfRopeConfig, FunctionChangingKeysRefusedByName) {
  struct Case {
    const char* name;
    json patch;
    std::string message;
  };
  const Case cases[] = {
      {"llama3-rope-scaled", {{"rope_parameters", {{"attention_factor", 2.0}}}},
       "c.json: key 'rope_parameters.attention_factor' is not supported with rope_type 'llama3'"},
      {"llama-gqa", {{"rope_parameters", {{"factor", 4.0}}}},
       "c.json: key 'rope_parameters.factor' is not supported with rope_type 'default'"},
      {"llama-gqa", {{"rope_parameters", {{"partial_rotary_factor", 0.5}}}},
       "c.json: rope_parameters.partial_rotary_factor = 0.5 is not supported (expected 1"},
      {"llama-gqa", {{"partial_rotary_factor", 0.25}}, "c.json: partial_rotary_factor = 0.25 is not supported (expected 1"},
      // Gemma 3 style per-layer-type parameters.
      {"llama-gqa",
       {{"rope_parameters", {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}}}}},
       "c.json: key 'rope_parameters.full_attention' is not supported with rope_type 'default'"},
  };
  for (const Case& k : cases) {
    json j = tiny_config(k.name);
    j.merge_patch(k.patch);
    expect_error<UnsupportedError>([&] { parse_hf_config(j, "c.json"); }, {k.message});
  }
  // partial_rotary_factor 1 is plain RoPE (phi3's hf-tiny config carries it).
  json j = tiny_config("llama-gqa");
  j["rope_parameters"]["partial_rotary_factor"] = 1.0;
  EXPECT_TRUE(parse_hf_config(j, "c.json").rope_scaling.is_default());
}

/// Expects an InputError that is not an UnsupportedError, with `part` in its message.
template <typename F>
void expect_plain_input_error(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "expected an exception, none thrown";
  } catch (const UnsupportedError& e) {
    ADD_FAILURE() << "expected a plain InputError, got UnsupportedError: " << e.what();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "'" << part << "' not in: " << e.what();
  }
}

TEST(HfRopeConfig, MissingOrInconsistentValuesAreInputErrors) {
  struct Case {
    const char* name;
    json patch;
    std::string message;
  };
  const Case cases[] = {
      {"llama3-rope-scaled", {{"rope_parameters", {{"low_freq_factor", nullptr}}}},
       "c.json: required key 'rope_parameters.low_freq_factor' is missing (rope_type 'llama3' needs it)"},
      {"llama-linear-rope", {{"rope_parameters", {{"factor", "4"}}}}, "c.json: key 'rope_parameters.factor' must be a number"},
      {"llama-linear-rope", {{"rope_parameters", {{"factor", 0.0}}}}, "factor must be a finite positive number"},
      {"llama3-rope-scaled", {{"rope_parameters", {{"high_freq_factor", 1.0}}}},
       "high_freq_factor (1.000000) must be finite and greater than low_freq_factor (1.000000)"},
      {"llama3-rope-scaled", {{"rope_parameters", {{"original_max_position_embeddings", 0}}}},
       "original_max_position_embeddings must be positive"},
      {"llama-gqa", {{"rope_parameters", {{"rope_theta", 1e39}}}},
       "c.json: key 'rope_parameters.rope_theta' = 1e+39 is out of range for a 32-bit float"},
      {"llama-gqa", {{"rope_theta", 500000.0}},
       "c.json: key 'rope_parameters.rope_theta' = 10000 disagrees with 'rope_theta' = 500000"},
      {"llama-gqa", {{"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}}},
       "c.json: keys 'rope_parameters' ({\"rope_theta\":10000.0,\"rope_type\":\"default\"}) and 'rope_scaling'"},
      {"llama-gqa", {{"rope_parameters", {{"type", "linear"}, {"factor", 2.0}}}},
       "c.json: keys 'rope_parameters.rope_type' ('default') and 'rope_parameters.type' ('linear') disagree"},
      {"llama-gqa", {{"rope_parameters", json::array()}}, "c.json: key 'rope_parameters' must be an object or null"},
  };
  for (const Case& k : cases) {
    json j = tiny_config(k.name);
    if (k.patch.contains("rope_parameters") && k.patch["rope_parameters"].is_array())
      j["rope_parameters"] = json::array();
    else
      j.merge_patch(k.patch);
    expect_plain_input_error([&] { parse_hf_config(j, "c.json"); }, k.message);
  }
}

// make_hf_config_json writes the scaling as legacy rope_scaling + rope_theta; it reads back equal.
TEST(HfRopeConfig, WrittenConfigRoundTrips) {
  for (const char* name : {"llama-gqa", "llama-linear-rope", "llama3-rope-scaled"}) {
    const ModelConfig c = parse_hf_config(tiny_config(name), "c.json");
    const json written = json::parse(make_hf_config_json(c, "float32").dump());
    const ModelConfig r = parse_hf_config(written, "w.json");
    EXPECT_TRUE(r.rope_scaling == c.rope_scaling) << name << ": " << written.dump();
    EXPECT_EQ(r.rope_theta, c.rope_theta) << name;
    EXPECT_EQ(written["rope_scaling"].is_null(), c.rope_scaling.is_default()) << name;
  }
  const json w = json::parse(make_hf_config_json(parse_hf_config(tiny_config("llama3-rope-scaled"), "c.json"), "float32").dump());
  EXPECT_EQ(w["rope_scaling"], json::parse(R"({"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,)"
                                           R"("original_max_position_embeddings":32})"));
}

// A tool refuses an unsupported rope_type with one line naming the file and key, exit status 2.
TEST(HfRopeConfig, ToolRefusesUnsupportedRopeType) {
  ScratchDir dir;
  json j = tiny_config("llama3-rope-scaled");
  j["rope_parameters"]["rope_type"] = "yarn";
  fs::create_directories(dir.file("m"));
  write_file(dir.file("m/config.json"), j.dump(2));
  fs::create_symlink(tiny("llama3-rope-scaled") + "/model.safetensors", dir.file("m/model.safetensors"));
  const ProcessResult r = run_process({tool("sq-eval"), "-m", dir.file("m"), "-f", tinystories_valid()});
  std::printf("[ measured ] sq-eval stderr: %s", r.err.c_str());
  expect_one_line_exit2(r, dir.file("m") + "/config.json: rope_parameters.rope_type = 'yarn' is not supported (expected "
                                           "'default', 'linear' or 'llama3'; RoPE scaling 'yarn' is not implemented)");
}

// ---- .sqm files and fingerprints -----------------------------------------------------------------

// sq-convert carries the scaling into the .sqm header; the packed FP32 model computes exactly what
// the HF directory computes (same weights, same code), hence transformers' logits.
TEST(RopeSqm, ConvertedScaledModelMatchesTheHfDirectory) {
  ScratchDir dir;
  for (const char* name : {"llama-linear-rope", "llama3-rope-scaled"}) {
    const std::string out = dir.file(std::string(name) + ".sqm");
    const ProcessResult r = run_process({tool("sq-convert"), "-m", tiny(name), "--scheme", "f32", "-o", out, "-q"});
    ASSERT_EQ(r.exit_status, 0) << r.err;
    const json mc = SqmFile::open(out)->header().at("model_config");
    ASSERT_TRUE(mc.contains("rope_scaling")) << mc.dump();
    EXPECT_EQ(mc["rope_scaling"]["type"], std::string(name) == "llama-linear-rope" ? "linear" : "llama3");

    const LoadedModel hf = load_model(tiny(name)), sqm = load_model(out);
    EXPECT_TRUE(sqm.model->config().rope_scaling == hf.model->config().rope_scaling) << name;
    const Reference ref = load_reference(name);
    const std::vector<float> a = run(*hf.model, ref.ids), b = run(*sqm.model, ref.ids);
    EXPECT_EQ(a, b) << name;
    EXPECT_LT(compare(b.data(), ref.logits.data(), int64_t(ref.ids.size()), sqm.model->config().vocab_size).max_abs, kLogitTol)
        << name;
  }
}

TEST(RopeSqm, HeaderRopeScalingRoundTripsAndOldHeadersArePlain) {
  ModelConfig c = parse_hf_config(tiny_config("llama3-rope-scaled"), "c.json");
  json j = model_config_to_json(c);
  EXPECT_TRUE(model_config_from_json(j, "f.sqm").rope_scaling == c.rope_scaling);
  // A header written before RoPE scaling existed has no key: plain RoPE, as it always ran.
  j.erase("rope_scaling");
  EXPECT_TRUE(model_config_from_json(j, "f.sqm").rope_scaling.is_default());
  EXPECT_FALSE(model_config_to_json(model_config_from_json(j, "f.sqm")).contains("rope_scaling"));
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  expect_error<UnsupportedError>([&] { model_config_from_json(j, "f.sqm"); }, {"f.sqm: model_config.rope_scaling.type 'yarn'"});
  j["rope_scaling"] = {{"type", "llama3"}, {"factor", 4.0}};
  expect_error<InputError>([&] { model_config_from_json(j, "f.sqm"); }, {"f.sqm: model_config.rope_scaling has no 'low_freq_factor'"});
}

TEST(RopeFingerprint, ChangesWithTheScaling) {
  Checkpoint plain_ck = load_hf_checkpoint(tiny("llama-gqa"));
  Checkpoint scaled = load_hf_checkpoint(tiny("llama3-rope-scaled"));
  // Same architecture and tensor inventory; only the RoPE scaling differs.
  EXPECT_EQ(model_fingerprint_json(plain_ck).find("rope_scaling"), std::string::npos);
  const std::string sj = model_fingerprint_json(scaled);
  EXPECT_NE(sj.find(R"("rope_scaling":{"factor":"8","high_freq_factor":"4","low_freq_factor":"1",)"
                    R"("original_max_position_embeddings":32,"type":"llama3"})"),
            std::string::npos)
      << sj;
  EXPECT_NE(model_fingerprint(plain_ck), model_fingerprint(scaled));
  Checkpoint other = scaled;
  other.config.rope_scaling.factor = 4.0f;
  EXPECT_NE(model_fingerprint(other), model_fingerprint(scaled));
  other.config.rope_scaling = RopeScaling{};
  EXPECT_EQ(model_fingerprint(other), model_fingerprint(plain_ck));
}

}  // namespace
}  // namespace sq::test
