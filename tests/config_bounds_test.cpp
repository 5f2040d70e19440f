// Issue 14 point 5: config dimensions are checked against the tensors present (file headers)
// before any per-layer work, so a hostile num_hidden_layers / hidden_size / ... is refused at once
// with one line naming the config key and the tensors found, instead of running for minutes.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "formats/hf_checkpoint.h"
#include "formats/sqm_file.h"
#include "model/model_loader.h"
#include "tests/support/cli.h"
#include "tests/support/expect_error.h"
#include "tests/support/process.h"
#include "tests/support/test_data.h"

namespace sq::test {
namespace {

namespace fs = std::filesystem;

std::string tiny(const std::string& name) { return shared_data("reference/hf-tiny/" + name); }

/// A copy of hf-tiny/llama-gqa (2 layers, hidden 64, 4 heads × 16, 2 KV heads, intermediate 128,
/// vocab 320) in a scratch directory: its config.json with `edits` applied, its weights symlinked
/// (never copied into the repository).
std::string hostile_copy(const ScratchDir& dir, const nlohmann::json& edits, const std::string& name = "m") {
  const std::string out = dir.file(name);
  fs::create_directories(out);
  nlohmann::json cfg = nlohmann::json::parse(read_file(tiny("llama-gqa") + "/config.json"));
  cfg.merge_patch(edits);
  write_file(out + "/config.json", cfg.dump(2));
  fs::create_symlink(tiny("llama-gqa") + "/model.safetensors", out + "/model.safetensors");
  return out;
}

/// Seconds `f` takes.
template <typename F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The refusal reads one config.json and one safetensors header (a few KB): it takes about a
// millisecond. Before the check, 1e9 layers ran for more than 60 s. 1 s separates the two by orders
// of magnitude even on a loaded machine, for the in-process call; the tool (a process start,
// dynamic linking) gets 10 s.
constexpr double kInProcessLimitS = 1.0;
constexpr double kToolLimitS = 10.0;

struct Hostile {
  const char* key;
  nlohmann::json value;
  std::vector<std::string> message;  ///< parts of the expected message after "DIR/config.json: "
};

class ConfigBounds : public ::testing::TestWithParam<Hostile> {};

TEST_P(ConfigBounds, RefusedQuicklyNamingKeyAndTensors) {
  const Hostile& h = GetParam();
  ScratchDir dir;
  const std::string model = hostile_copy(dir, {{h.key, h.value}});
  std::vector<std::string> parts = {model + "/config.json: "};
  parts.insert(parts.end(), h.message.begin(), h.message.end());
  std::string msg;
  const double s = seconds([&] { msg = expect_error<InputError>([&] { load_hf_checkpoint(model); }, parts); });
  std::printf("[ measured ] %s = %s refused in %.4f s: %s\n", h.key, h.value.dump().c_str(), s, msg.c_str());
  EXPECT_LT(s, kInProcessLimitS);
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;

  // The tool prints that one line and exits 2, without evaluating anything.
  ProcessResult r;
  const double ts = seconds([&] {
    r = run_process({tool("sq-eval"), "-m", model, "-f", tinystories_valid()}, /*timeout_s=*/60);
  });
  std::printf("[ measured ] sq-eval: %.3f s, stderr: %s", ts, r.err.c_str());
  expect_one_line_exit2(r, h.message.front());
  EXPECT_LT(ts, kToolLimitS);
}

INSTANTIATE_TEST_SUITE_P(
    HfTinyLlama, ConfigBounds,
    ::testing::Values(
        Hostile{"num_hidden_layers", 1000000000,
                {"num_hidden_layers = 1000000000, but the checkpoint's tensors hold 2 layers (model.layers.0 … model.layers.1)"}},
        Hostile{"num_hidden_layers", 1000000,
                {"num_hidden_layers = 1000000, but the checkpoint's tensors hold 2 layers (model.layers.0 … model.layers.1)"}},
        Hostile{"num_hidden_layers", 3, {"num_hidden_layers = 3, but the checkpoint's tensors hold 2 layers"}},
        Hostile{"hidden_size", 1000000000,
                {"hidden_size = 1000000000, but tensor 'model.embed_tokens.weight' has shape [320, 64] (expected [vocab_size, hidden_size])"}},
        Hostile{"vocab_size", 1000000000,
                {"vocab_size = 1000000000, but tensor 'model.embed_tokens.weight' has shape [320, 64] (expected [vocab_size, hidden_size])"}},
        Hostile{"intermediate_size", 1000000000,
                {"intermediate_size = 1000000000, but tensor 'model.layers.0.mlp.gate_proj.weight' has shape [128, 64] "
                 "(expected [intermediate_size, hidden_size])"}},
        Hostile{"num_attention_heads", 1000000000,
                {"num_attention_heads × head_dim = 1000000000 × 16 = 16000000000, but tensor "
                 "'model.layers.0.self_attn.q_proj.weight' has shape [64, 64]"}},
        Hostile{"num_key_value_heads", 4,
                {"num_key_value_heads × head_dim = 4 × 16 = 64, but tensor 'model.layers.0.self_attn.k_proj.weight' has "
                 "shape [32, 64] (expected [num_key_value_heads × head_dim, hidden_size])"}}),
    [](const auto& info) { return std::string(info.param.key) + "_" + std::to_string(info.index); });

// A config with fewer layers than the file is what transformers runs (extra weights ignored), so
// it stays accepted: the check bounds the work, it does not forbid truncation.
TEST(ConfigBoundsAccepts, FewerLayersThanTheFile) {
  ScratchDir dir;
  const Checkpoint ck = load_hf_checkpoint(hostile_copy(dir, {{"num_hidden_layers", 1}}));
  EXPECT_EQ(ck.config.n_layers, 1);
  EXPECT_TRUE(ck.has("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(ck.has("model.layers.1.self_attn.q_proj.weight"));
}

// The same bound on a packed .sqm file: its header's model_config.n_layers is checked against the
// tensor table before the per-layer vector is allocated (1e9 DecoderLayer objects would be hundreds
// of GB).
TEST(ConfigBoundsSqm, HugeLayerCountRefusedQuickly) {
  ScratchDir dir;
  const std::string good = dir.file("good.sqm"), bad = dir.file("bad.sqm");
  const auto r = run_process({tool("sq-convert"), "-m", tiny("llama-gqa"), "--scheme", "f32", "-o", good, "-q"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  {
    const auto f = SqmFile::open(good);
    nlohmann::json header = f->header();
    header.erase("format");  // bookkeeping, written by finish()
    header["model_config"]["n_layers"] = 1000000000;
    SqmWriter w(bad);
    for (const auto& name : f->names()) {
      const SqmTensorInfo& info = f->info(name);
      const SqmBytes raw = f->raw(name);
      w.add_tensor(name, info.dtype, info.shape, raw.data, raw.size);
    }
    w.finish(header);
  }
  std::string msg;
  const double s = seconds([&] {
    msg = expect_error<InputError>([&] { load_model(bad); },
                                   {bad + ": model_config: n_layers = 1000000000, but the checkpoint's tensors hold 2 layers "
                                          "(model.layers.0 … model.layers.1)"});
  });
  std::printf("[ measured ] .sqm n_layers = 1e9 refused in %.4f s: %s\n", s, msg.c_str());
  EXPECT_LT(s, kInProcessLimitS);
}

}  // namespace
}  // namespace sq::test
