// Non-finite weights and activations (issue 14, point 4; docs/reliability.md).
//
// Weights: a NaN or ±Inf stored in a llama2.c checkpoint, a Hugging Face directory (F32, and the
// F16 / BF16 Inf and NaN bit patterns) or a .sqm file (FP32 / FP16 tensors and scales) is refused
// once at load (load_model) with NonFiniteError naming the file, the tensor and the first bad
// index; every tool exits 2 with that one line and writes nothing.
// Activations: finite but huge weights (1e30 in a norm weight) that make the activations overflow
// stop every evaluation driver (sq-eval windows / llamacpp / streaming, sq-run, sq-calibrate)
// with NonFiniteError naming the layer, the site inside it and where in the text.
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/finite.h"
#include "eval/perplexity.h"
#include "eval/streaming.h"
#include "formats/hf_checkpoint.h"
#include "formats/llama2c_checkpoint.h"
#include "formats/mapped_file.h"
#include "formats/safetensors.h"
#include "formats/sqm_file.h"
#include "formats/tokenizer.h"
#include "model/model_loader.h"
#include "runtime/generator.h"
#include "tests/support/cli.h"
#include "tests/support/expect_error.h"
#include "tests/support/process.h"
#include "tests/support/test_data.h"

namespace sq::test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// The finite-check primitives.

TEST(FirstNonFinite, FindsTheFirstNaNOrInfAcrossBlocks) {
  // Positions at block boundaries (blocks of 1024) and the last element; every finite extreme
  // (largest finite, smallest subnormal, −0) must pass.
  for (const int64_t n : {int64_t(1), int64_t(1023), int64_t(1024), int64_t(1025), int64_t(5000)}) {
    std::vector<float> x(static_cast<size_t>(n), 0.5f);
    x[0] = std::numeric_limits<float>::max();
    if (n > 1) x[1] = -std::numeric_limits<float>::denorm_min();
    if (n > 2) x[2] = -0.0f;
    EXPECT_EQ(first_nonfinite_f32(x.data(), n), -1) << n;
    for (const int64_t at : {int64_t(0), n / 2, n - 1})
      for (const float bad : {kNaN, kInf, -kInf}) {
        std::vector<float> y = x;
        y[static_cast<size_t>(at)] = bad;
        if (at + 1 < n) y[static_cast<size_t>(n - 1)] = kNaN;  // a later one must not win
        EXPECT_EQ(first_nonfinite_f32(y.data(), n), at) << n << " " << at << " " << bad;
      }
  }
  EXPECT_EQ(first_nonfinite_f32(nullptr, 0), -1);
}

TEST(FirstNonFinite, HalfAndBfloat16BitPatterns) {
  // F16: 0x7BFF = 65504 (largest finite), 0x0001 smallest subnormal, 0x8000 = −0; 0x7C00 = +Inf,
  // 0xFC00 = −Inf, 0x7E00 / 0x7C01 = NaN (quiet / signalling payload).
  std::vector<uint16_t> h(3000, 0x3C00);  // 1.0
  h[0] = 0x7BFF;
  h[1] = 0x0001;
  h[2] = 0x8000;
  h[3] = 0xFBFF;
  EXPECT_EQ(first_nonfinite_f16(h.data(), int64_t(h.size())), -1);
  for (const uint16_t bad : {uint16_t(0x7C00), uint16_t(0xFC00), uint16_t(0x7E00), uint16_t(0x7C01)}) {
    std::vector<uint16_t> y = h;
    y[2047] = bad;
    y[2999] = 0x7C00;
    EXPECT_EQ(first_nonfinite_f16(y.data(), int64_t(y.size())), 2047) << std::hex << bad;
  }
  // BF16: 0x7F7F largest finite; 0x7F80 = +Inf, 0xFF80 = −Inf, 0x7FC0 / 0x7F81 = NaN. 0x7C00 is a
  // finite bfloat16 (2^121): the F16 mask must not be used for it.
  std::vector<uint16_t> b(1500, 0x3F80);  // 1.0
  b[0] = 0x7F7F;
  b[1] = 0x7C00;
  b[2] = 0x8000;
  EXPECT_EQ(first_nonfinite_bf16(b.data(), int64_t(b.size())), -1);
  for (const uint16_t bad : {uint16_t(0x7F80), uint16_t(0xFF80), uint16_t(0x7FC0), uint16_t(0x7F81)}) {
    std::vector<uint16_t> y = b;
    y[1024] = bad;
    EXPECT_EQ(first_nonfinite_bf16(y.data(), int64_t(y.size())), 1024) << std::hex << bad;
  }
}

TEST(FirstNonFinite, ElementPositionNamesCoordinates) {
  EXPECT_EQ(element_position(7, {64}), "index 7");
  EXPECT_EQ(element_position(130, {172, 64}), "index 130 (element [2, 2] of shape [172, 64])");
  EXPECT_EQ(nonfinite_name(kNaN), "nan");
  EXPECT_EQ(nonfinite_name(kInf), "inf");
  EXPECT_EQ(nonfinite_name(-kInf), "-inf");
}

// ---------------------------------------------------------------------------------------------
// Models with one bad weight, in every format.

struct Patch {
  std::string tensor;
  int64_t index;
  float value;
};

/// stories260K (llama2.c) with `patches` applied to its float bytes, written to `path`. The
/// offsets come from the reader's own views into the mapped file.
std::string patched_stories(const std::string& path, const std::vector<Patch>& patches) {
  const auto file = MappedFile::open(stories_model());
  const Checkpoint ck = load_llama2c_checkpoint(file);
  std::string bytes(reinterpret_cast<const char*>(file->data()), file->size());
  for (const Patch& p : patches) {
    const Tensor& t = ck.tensors.at(p.tensor);
    EXPECT_LT(p.index, t.numel()) << p.tensor;
    const size_t off = static_cast<size_t>(reinterpret_cast<const uint8_t*>(t.data() + p.index) - file->data());
    std::memcpy(&bytes[off], &p.value, sizeof(float));
  }
  write_file(path, bytes);
  return path;
}

/// stories260K saved as a Hugging Face directory in `dtype` with one element changed (a tensor
/// that save_hf_checkpoint does not permute: not q_proj / k_proj).
std::string stories_hf(const std::string& dir, const std::string& dtype, const Patch& p) {
  Checkpoint ck = load_llama2c_checkpoint(stories_model());
  Tensor t = ck.tensors.at(p.tensor).clone();
  t.mutable_data()[p.index] = p.value;
  ck.tensors[p.tensor] = t;
  save_hf_checkpoint(ck, dir, dtype);
  return dir;
}

/// Rewrites the .sqm `src` as `dst` with element `index` of tensor `name` replaced by the raw
/// element bytes `elem` (4 bytes for F32, 2 for F16/BF16); checksums are recomputed, so only the
/// finite check can object.
void rewrite_sqm(const std::string& src, const std::string& dst, const std::string& name, int64_t index, const void* elem,
                 size_t elem_size) {
  const auto f = SqmFile::open(src);
  ASSERT_TRUE(f->has(name)) << name;
  SqmWriter w(dst);
  for (const SqmTensorInfo& info : f->tensors()) {
    const SqmBytes raw = f->raw(info.name);
    std::vector<uint8_t> b(raw.data, raw.data + raw.size);
    if (info.name == name) {
      ASSERT_LE(size_t(index + 1) * elem_size, b.size());
      std::memcpy(b.data() + size_t(index) * elem_size, elem, elem_size);
    }
    w.add_tensor(info.name, info.dtype, info.shape, b.data(), b.size());
  }
  nlohmann::json h = f->header();
  h.erase("format");
  w.finish(h);
}

std::string converted_stories(const ScratchDir& dir, const std::string& scheme, const std::vector<std::string>& extra) {
  const std::string out = dir.file("base-" + scheme + ".sqm");
  const ProcessResult r = convert_stories(scheme, extra, out);
  EXPECT_EQ(r.exit_status, 0) << r.err;
  return out;
}

TEST(NonFiniteWeights, Llama2cNaNAndInfAreRefusedAtLoadNamingTensorAndIndex) {
  ScratchDir dir;
  const std::string nan_bin = patched_stories(dir.file("nan.bin"), {{"model.layers.2.mlp.down_proj.weight", 100, kNaN}});
  expect_error<NonFiniteError>([&] { load_model(nan_bin); },
                               {nan_bin + ": tensor 'model.layers.2.mlp.down_proj.weight' holds a non-finite value (nan) at "
                                          "index 100 (element [0, 100] of shape [64, 172])"});
  // Two bad values: the message names the first index of that tensor.
  const std::string inf_bin = patched_stories(dir.file("inf.bin"), {{"model.norm.weight", 63, -kInf}, {"model.norm.weight", 9, kInf}});
  expect_error<NonFiniteError>([&] { load_model(inf_bin); },
                               {inf_bin + ": tensor 'model.norm.weight' holds a non-finite value (inf) at index 9"});
  // The unpatched model still loads (the check does not misfire on real weights).
  EXPECT_NO_THROW(load_model(stories_model()));
}

TEST(NonFiniteWeights, HuggingFaceF32F16Bf16PatternsAreRefusedAtLoad) {
  ScratchDir dir;
  const std::string up = "model.layers.1.mlp.up_proj.weight";  // [172, 64]
  const std::string pos = "index 130 (element [2, 2] of shape [172, 64])";
  // F32 NaN; F16: a finite 1e6 overflows to the F16 Inf pattern (0x7C00) when saved; F16 NaN;
  // BF16 −Inf and NaN patterns.
  struct Case {
    const char* dtype;
    float value;
    const char* name;
  };
  for (const Case& c : {Case{"F32", kNaN, "nan"}, Case{"F16", 1e6f, "inf"}, Case{"F16", kNaN, "nan"}, Case{"BF16", -kInf, "-inf"},
                        Case{"BF16", kNaN, "nan"}}) {
    const std::string d = stories_hf(dir.file(std::string(c.dtype) + "-" + c.name), c.dtype, {up, 130, c.value});
    expect_error<NonFiniteError>([&] { load_model(d); },
                                 {d + ": tensor '" + up + "' holds a non-finite value (" + c.name + ") at " + pos});
  }
  // Finite BF16 / F16 copies load.
  const Patch none{up, 130, 0.25f};
  EXPECT_NO_THROW(load_model(stories_hf(dir.file("ok-bf16"), "BF16", none)));
  EXPECT_NO_THROW(load_model(stories_hf(dir.file("ok-f16"), "F16", none)));
}

TEST(NonFiniteWeights, SqmFp32Fp16TensorsAndScalesAreRefusedAtLoad) {
  ScratchDir dir;
  const uint32_t f32_nan = 0x7FC00000u, f32_inf = 0x7F800000u;
  const uint16_t f16_inf = 0x7C00, f16_nan = 0x7E00;
  struct Case {
    std::string scheme;
    std::vector<std::string> extra;
    std::string tensor;
    int64_t index;
    const void* elem;
    size_t size;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"f32", {}, "model.layers.0.input_layernorm.weight", 5, &f32_nan, 4, "(F32) holds a non-finite value (nan) at index 5"},
      {"f16", {}, "model.layers.3.self_attn.o_proj.weight", 70, &f16_inf, 2,
       "(F16) holds a non-finite value (inf) at index 70 (element [1, 6] of shape [64, 64])"},
      {"w8a8", {"--no-smooth"}, "model.layers.1.mlp.gate_proj.weight_scale", 3, &f32_inf, 4,
       "(F32) holds a non-finite value (inf) at index 3"},
      {"w4a16", {"--no-k-quant"}, "model.layers.4.mlp.down_proj.weight_scale", 2, &f16_nan, 2,
       "(F16) holds a non-finite value (nan) at index 2"},
  };
  for (const Case& c : cases) {
    const std::string base = converted_stories(dir, c.scheme, c.extra);
    EXPECT_NO_THROW(load_model(base)) << c.scheme;
    const std::string bad = dir.file("bad-" + c.scheme + ".sqm");
    rewrite_sqm(base, bad, c.tensor, c.index, c.elem, c.size);
    expect_error<NonFiniteError>([&] { load_model(bad); }, {bad + ": tensor '" + c.tensor + "' " + c.expected});
  }
  // The default W4A16 layout (Q4_K): the FP16 d and dmin live in the U8 super-block heads (16 bytes each, d first);
  // an infinite d of row 1's only super-block (stories' rows are one short super-block each) is refused at load.
  const std::string k = dir.file("base-q4k.sqm"), kbad = dir.file("bad-q4k.sqm");
  const ProcessResult r = convert_stories("w4a16", {}, k);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NO_THROW(load_model(k));
  const std::string sb = "model.layers.4.mlp.down_proj.weight_superblock_scale";
  rewrite_sqm(k, kbad, sb, 8, &f16_inf, 2);  // element 8 of 2 bytes = byte 16: the d of row 1
  expect_error<InputError>([&] { load_model(kbad); }, {kbad + ": tensor '" + sb + "'", "row 1 super-block 0: d or dmin not finite"});
}

/// Every tool on `model` (with the stories tokenizer): exit 2, one stderr line containing
/// `expected`, no output file.
void expect_every_tool_refuses(const ScratchDir& dir, const std::string& model, const std::string& expected) {
  const std::string tok = stories_tokenizer();
  const std::string json = dir.file("eval.json"), h5 = dir.file("calib.h5"), w8 = dir.file("w8a8.sqm"), w4 = dir.file("w4a16.sqm");
  SCOPED_TRACE(model);
  expect_one_line_exit2(run_process({tool("sq-eval"), "-m", model, "--tokenizer", tok, "-f", tinystories_valid(), "-c", "64",
                                     "--chunks", "4", "-q", "--json", json}),
                        expected, json);
  expect_one_line_exit2(run_process({tool("sq-calibrate"), "-m", model, "--tokenizer", tok, "-f",
                                     shared_data("tinystories/tinystories-train-2MiB.txt"), "--samples", "4", "--seq-len", "32",
                                     "-o", h5, "-q"}),
                        expected, h5);
  expect_one_line_exit2(run_process({tool("sq-convert"), "-m", model, "--tokenizer", tok, "--scheme", "w8a8", "--no-smooth",
                                     "-o", w8, "-q"}),
                        expected, w8);
  expect_one_line_exit2(
      run_process({tool("sq-convert"), "-m", model, "--tokenizer", tok, "--scheme", "w4a16", "-o", w4, "-q"}), expected, w4);
  const ProcessResult run =
      run_process({tool("sq-run"), "-m", model, "--tokenizer", tok, "-p", "Once upon a time", "-n", "8", "--temp", "0", "-q"});
  expect_one_line_exit2(run, expected);
  EXPECT_EQ(run.out, "") << "sq-run must fail before printing the prompt";
}

TEST(NonFiniteWeightsCli, EveryToolExits2NamingTheTensorAndWritesNothing) {
  ScratchDir dir;
  const std::string nan_bin = patched_stories(dir.file("nan.bin"), {{"model.layers.2.mlp.down_proj.weight", 100, kNaN}});
  expect_every_tool_refuses(dir, nan_bin,
                            "error: " + nan_bin + ": tensor 'model.layers.2.mlp.down_proj.weight' holds a non-finite value (nan) at index 100");
  const std::string hf = stories_hf(dir.file("hf-f16"), "F16", {"model.layers.1.mlp.up_proj.weight", 130, 1e6f});
  expect_every_tool_refuses(dir, hf, "error: " + hf + ": tensor 'model.layers.1.mlp.up_proj.weight' holds a non-finite value (inf) at index 130");
  const std::string base = converted_stories(dir, "w8a8", {"--no-smooth"});
  const uint32_t f32_nan = 0x7FC00000u;
  const std::string sqm = dir.file("nan-scale.sqm");
  rewrite_sqm(base, sqm, "model.layers.0.self_attn.v_proj.weight_scale", 7, &f32_nan, 4);
  expect_every_tool_refuses(dir, sqm,
                            "error: " + sqm + ": tensor 'model.layers.0.self_attn.v_proj.weight_scale' (F32) holds a non-finite value (nan) at index 7");
}

// ---------------------------------------------------------------------------------------------
// Activation overflow with finite weights.

/// stories260K with every input_layernorm weight of layer 1 set to 1e30 (finite): layer 1's
/// queries and keys are ~1e30, their dot products overflow to Inf and the softmax gives NaN, so the
/// first non-finite activation is layer 1's attention output (the o_proj input), at every token.
std::string attention_overflow_model(const ScratchDir& dir) {
  std::vector<Patch> p;
  for (int j = 0; j < 64; ++j) p.push_back({"model.layers.1.input_layernorm.weight", j, 1e30f});
  return patched_stories(dir.file("attn-overflow.bin"), p);
}

const char* kAttnLayer1 = "non-finite activation in layer 1 (attention output, the o_proj input)";

std::vector<int32_t> stories_tokens(size_t max_tokens) {
  const auto tok = load_tokenizer(stories_tokenizer());
  const std::string text = read_file(tinystories_valid()).substr(0, 20000);
  const std::vector<int> ids = tok->encode(text, true, false);
  std::vector<int32_t> out(ids.begin(), ids.end());
  if (out.size() > max_tokens) out.resize(max_tokens);
  return out;
}

TEST(NonFiniteActivations, FiniteWeightsThatOverflowAreNotRefusedAtLoad) {
  ScratchDir dir;
  EXPECT_NO_THROW(load_model(attention_overflow_model(dir)));
}

TEST(NonFiniteActivations, PerplexityNamesLayerSiteAndFirstChunkForAnyThreadCount) {
  ScratchDir dir;
  const LoadedModel m = load_model(attention_overflow_model(dir));
  const std::vector<int32_t> tokens = stories_tokens(2000);
  for (const PplProtocol proto : {PplProtocol::Windows, PplProtocol::LlamaCpp})
    for (const int threads : {1, 2}) {  // sequential chunks, and chunks in parallel (dim < 1024)
      const int saved = omp_get_max_threads();
      omp_set_num_threads(threads);
      PerplexityOptions o;
      o.protocol = proto;
      o.ctx = 64;
      expect_error<NonFiniteError>([&] { evaluate_perplexity(*m.model, tokens, o); },
                                   {std::string(kAttnLayer1) + " at chunk 0 (tokens 0-63)", "the weights are finite"});
      omp_set_num_threads(saved);
    }
}

TEST(NonFiniteActivations, FeedForwardOverflowNamesTheFeedForwardSite) {
  // post_attention_layernorm of layer 3 = 1e30: gate and up are ~1e30 (finite), silu(gate)*up
  // ~1e60 overflows: the first non-finite value is layer 3's down_proj input.
  ScratchDir dir;
  std::vector<Patch> p;
  for (int j = 0; j < 64; ++j) p.push_back({"model.layers.3.post_attention_layernorm.weight", j, 1e30f});
  const LoadedModel m = load_model(patched_stories(dir.file("ffn-overflow.bin"), p));
  PerplexityOptions o;
  o.ctx = 32;
  o.max_chunks = 3;
  expect_error<NonFiniteError>([&] { evaluate_perplexity(*m.model, stories_tokens(500), o); },
                               {"non-finite activation in layer 3 (feed-forward hidden state silu(gate)*up, the down_proj input) "
                                "at chunk 0 (tokens 0-31)"});
}

TEST(NonFiniteActivations, BackendNeutralDriverUsesTheLocatorOrNamesTheChunk) {
  ScratchDir dir;
  const LoadedModel m = load_model(attention_overflow_model(dir));
  const std::vector<int32_t> tokens = stories_tokens(500);
  PerplexityOptions o;
  o.ctx = 32;
  // A runner that yields NaN logits from chunk `bad_from` on (another backend's failure).
  int calls = 0, bad_from = 2;
  const auto runner = [&](const int32_t*, int ctx, float* logits) {
    std::fill(logits, logits + int64_t(ctx) * m.model->config().vocab_size, calls++ >= bad_from ? kNaN : 0.0f);
    return KVCacheBytes{};
  };
  expect_error<NonFiniteError>([&] { evaluate_perplexity_with(m.model->config(), tokens, o, runner); },
                               {"non-finite logits at chunk 2 (tokens 64-95) (the weights are finite; the layer could not be "
                                "located on this backend)"});
  o.locate_nonfinite = [&](const int32_t* input, int) { return locate_nonfinite_chunk(*m.model, input, o); };
  calls = 0;
  bad_from = 0;
  expect_error<NonFiniteError>([&] { evaluate_perplexity_with(m.model->config(), tokens, o, runner); },
                               {std::string(kAttnLayer1) + " at chunk 0 (tokens 0-31)"});
}

/// stories260K where only token `spike` can overflow: column 0 of every other token's embedding row
/// is 0 and layer 0's input_layernorm weight 0 is 1e30, so the normed channel 0 is exactly 0 for
/// every token but `spike` (whose embedding[0] is 1): its layer-0 query and key overflow.
std::string token_spike_model(const std::string& path, int vocab, int spike) {
  std::vector<Patch> p;
  for (int t = 0; t < vocab; ++t) p.push_back({"model.embed_tokens.weight", int64_t(t) * 64, t == spike ? 1.0f : 0.0f});
  if (spike >= 0) p.push_back({"model.layers.0.input_layernorm.weight", 0, 1e30f});
  return patched_stories(path, p);
}

TEST(NonFiniteActivations, StreamingDecodeStepNamesTheTokenAndLayer) {
  ScratchDir dir;
  const std::vector<int32_t> tokens = stories_tokens(300);
  // The spike token: the token at position 20, which must not occur earlier in the text.
  const int32_t spike = tokens[20];
  const int64_t first = std::find(tokens.begin(), tokens.end(), spike) - tokens.begin();
  const LoadedModel m = load_model(token_spike_model(dir.file("spike.bin"), 512, spike));
  for (const char* policy : {"dense", "window:16", "h2o:8,recent:8"}) {
    StreamingOptions so;
    so.policy = parse_kv_policy(policy);
    so.max_tokens = 200;
    expect_error<NonFiniteError>([&] { evaluate_streaming(*m.model, tokens, so); },
                                 {"non-finite activation in layer 0 (attention output, the o_proj input) at token " +
                                  std::to_string(first) + " of stream 0 (text token " + std::to_string(first) + ")"});
  }
  // Recompute:W re-runs windows; the first failing position is the first window holding the token.
  StreamingOptions so;
  so.policy = parse_kv_policy("recompute:8");
  so.max_tokens = 200;
  expect_error<NonFiniteError>([&] { evaluate_streaming(*m.model, tokens, so); },
                               {"non-finite activation in layer 0 (attention output, the o_proj input) at token " +
                                std::to_string(first) + " of stream 0"});
  // Without the 1e30 norm weight the same embedding edit evaluates normally.
  const LoadedModel ok = load_model(token_spike_model(dir.file("no-spike.bin"), 512, -1));
  StreamingOptions dense;
  dense.max_tokens = 200;
  EXPECT_TRUE(std::isfinite(evaluate_streaming(*ok.model, tokens, dense).ppl));
}

TEST(NonFiniteActivations, GenerationStopsAtTheDecodeStepThatOverflows) {
  ScratchDir dir;
  const auto tok = load_tokenizer(stories_tokenizer());
  const std::vector<int> ids = tok->encode("Once upon a time", true, false);
  const std::vector<int32_t> prompt(ids.begin(), ids.end());
  // Greedy first token of the model with column 0 of the embedding zeroed (the spike model minus the
  // spike behaves identically on the prompt, which does not contain that token).
  const LoadedModel base = load_model(token_spike_model(dir.file("zeroed.bin"), 512, -1));
  KVCache cache(base.model->config(), 64);
  Workspace ws;
  std::vector<float> logits(512);
  base.model->forward(prompt.data(), int64_t(prompt.size()), cache, ws, logits.data(), LogitsFor::LastToken);
  const int32_t g = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  ASSERT_EQ(std::find(prompt.begin(), prompt.end(), g), prompt.end());
  ASSERT_GT(g, 2);  // not <unk>, BOS or EOS

  const std::string spike = token_spike_model(dir.file("spike.bin"), 512, g);
  const LoadedModel m = load_model(spike);
  SamplerOptions greedy;
  greedy.temperature = 0.0f;
  Sampler sampler(greedy);
  std::vector<int32_t> emitted;
  expect_error<NonFiniteError>(
      [&] { generate(*m.model, prompt, 10, 512, sampler, [&](int32_t, int32_t t) { emitted.push_back(t); }); },
      {"non-finite activation in layer 0 (attention output, the o_proj input) at generated token 1 (position " +
       std::to_string(prompt.size()) + ")"});
  EXPECT_EQ(emitted, std::vector<int32_t>{g});

  // sq-run: the prompt and the first token are printed, then one error line, exit 2.
  const ProcessResult r = run_process({tool("sq-run"), "-m", spike, "--tokenizer", stories_tokenizer(), "-p", "Once upon a time",
                                       "-n", "10", "--temp", "0", "-q"});
  expect_one_line_exit2(r, "sq-run: error: non-finite activation in layer 0 (attention output, the o_proj input) at generated token 1");
}

TEST(NonFiniteActivationsCli, EveryEvaluationPathExits2NamingTheLayer) {
  ScratchDir dir;
  const std::string model = attention_overflow_model(dir);
  const std::string tok = stories_tokenizer();
  const std::string json = dir.file("eval.json"), h5 = dir.file("calib.h5");
  const std::vector<std::string> eval = {tool("sq-eval"), "-m", model, "--tokenizer", tok, "-f", tinystories_valid(), "-q",
                                         "--json", json};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& more) {
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const std::string layer = std::string("sq-eval: error: ") + kAttnLayer1;
  expect_one_line_exit2(run_process(with(eval, {"-c", "64", "--chunks", "8"})), layer + " at chunk 0 (tokens 0-63)", json);
  expect_one_line_exit2(run_process(with(eval, {"--protocol", "llamacpp", "-c", "64", "--chunks", "8"})),
                        layer + " at chunk 0 (tokens 0-63)", json);
  for (const char* policy : {"dense", "sink:4,window:16", "recompute:16"})
    expect_one_line_exit2(run_process(with(eval, {"--protocol", "streaming", "--kv-policy", policy, "--max-tokens", "100"})),
                          layer + " at token 0 of stream 0 (text token 0)", json);
  expect_one_line_exit2(run_process({tool("sq-calibrate"), "-m", model, "--tokenizer", tok, "-f",
                                     shared_data("tinystories/tinystories-train-2MiB.txt"), "--samples", "8", "--seq-len", "32",
                                     "-o", h5, "-q"}),
                        std::string("sq-calibrate: error: ") + kAttnLayer1 + " in calibration window 0 of 8", h5);
  expect_one_line_exit2(
      run_process({tool("sq-run"), "-m", model, "--tokenizer", tok, "-p", "Once upon a time", "-n", "8", "--temp", "0", "-q"}),
      std::string("sq-run: error: ") + kAttnLayer1 + " in the prompt (prefill of ");
}

}  // namespace
}  // namespace sq::test
