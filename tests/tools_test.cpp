// The sq-eval / sq-run command lines: exact outputs on the real model, and one clear line with
// exit status 2 for every bad input (never a crash, a hang or a partial output file).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "formats/hf_checkpoint.h"
#include "formats/llama2c_checkpoint.h"
#include "model/w4a16_linear.h"
#include "tests/support/process.h"
#include "tests/support/test_data.h"

namespace sq::test {
namespace {

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST(SqRun, GreedyStoryIsExact) {
  const auto r = run_process({tool("sq-run"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-p", "Once upon a time",
                              "-n", "40", "--temp", "0"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  // Issue #2 acceptance 1: stdout is exactly the prompt and the generated text, one line.
  EXPECT_EQ(r.out,
            "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, "
            "red ball.\n");
  EXPECT_NE(r.err.find("tok/s"), std::string::npos);  // speed goes to stderr
}

TEST(SqRun, SeededSamplingIsReproducible) {
  auto run = [](const char* seed) {
    return run_process({tool("sq-run"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-p", "The cat", "-n", "30",
                        "--temp", "0.9", "--top-k", "40", "--top-p", "0.95", "--seed", seed, "-q"})
        .out;
  };
  const std::string a = run("7"), b = run("7"), c = run("8");
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(a.rfind("The cat", 0), 0u);
}

TEST(SqEval, JsonOutputHasTheDocumentedFields) {
  ScratchDir dir;
  const auto r = run_process({tool("sq-eval"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-f", tinystories_valid(),
                              "-c", "256", "--protocol", "llamacpp", "--chunks", "40", "--json", dir.file("r.json")});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NE(r.out.find("PPL"), std::string::npos);
  const auto j = nlohmann::json::parse(read_file(dir.file("r.json")));
  for (const char* key : {"ppl", "ppl_stderr", "nll_mean", "tokens_scored", "tokens_per_second", "protocol", "model"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["protocol"]["name"], "llamacpp");
  EXPECT_EQ(j["protocol"]["ctx"], 256);
  EXPECT_EQ(j["protocol"]["chunks"], 40);
  EXPECT_EQ(j["tokens_scored"], 40 * 127);
  EXPECT_EQ(j["model"]["parameter_count"], 260032);
  EXPECT_GT(j["ppl"].get<double>(), 5.0);
  EXPECT_LT(j["ppl"].get<double>(), 12.0);
}



/// Each bad input: exit 2, exactly one line on stderr naming the problem, no JSON file written.
void expect_one_line_error(const std::string& tool_name, std::vector<std::string> args, const std::string& expected,
                           const ScratchDir& dir) {
  std::vector<std::string> argv = {tool(tool_name)};
  argv.insert(argv.end(), args.begin(), args.end());
  const auto r = run_process(argv, 60);
  EXPECT_EQ(r.exit_status, 2) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(expected), std::string::npos) << "stderr: " << r.err << "expected: " << expected;
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.json")));
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << "temporary left behind: " << e.path();
}

TEST(SqEval, BadInputsGiveOneLineAndExit2) {
  ScratchDir dir;
  write_file(dir.file("empty.txt"), "");
  write_file(dir.file("short.txt"), "Once upon a time there was a cat.");
  write_file(dir.file("garbage.bin"), std::string(100, '\x7f'));
  const std::string json = dir.file("out.json");
  const std::string m = stories_model(), t = stories_tokenizer(), f = tinystories_valid();
  expect_one_line_error("sq-eval", {"-m", dir.file("nope.bin"), "--tokenizer", t, "-f", f, "--json", json}, "cannot open", dir);
  expect_one_line_error("sq-eval", {"-m", m, "--tokenizer", dir.file("nope.bin"), "-f", f, "--json", json}, "cannot open", dir);
  expect_one_line_error("sq-eval", {"-m", m, "--tokenizer", t, "-f", dir.file("nope.txt"), "--json", json}, "cannot open", dir);
  expect_one_line_error("sq-eval", {"-m", m, "--tokenizer", t, "-f", dir.file("empty.txt"), "--json", json}, "empty", dir);
  expect_one_line_error("sq-eval", {"-m", m, "--tokenizer", t, "-f", dir.file("short.txt"), "--json", json}, "too short", dir);
  expect_one_line_error("sq-eval", {"-m", m, "--tokenizer", t, "-f", f, "-c", "1024", "--json", json},
                        "exceeds the model's trained context of 512", dir);
  expect_one_line_error("sq-eval", {"-m", m, "--tokenizer", llama2_tokenizer(), "-f", f, "--json", json},
                        "has 32000 tokens but model", dir);
  expect_one_line_error("sq-eval", {"-m", dir.file("garbage.bin"), "--tokenizer", t, "-f", f, "--json", json},
                        "not a recognized model", dir);
  expect_one_line_error("sq-eval", {"-m", m, "--tokenizer", t, "-f", f, "--protocol", "bogus", "--json", json},
                        "--protocol must be", dir);
  expect_one_line_error("sq-eval", {"-m", m, "-f", f, "--json", json}, "give --tokenizer", dir);
  // --allow-long-context lifts the context check.
  const auto r = run_process({tool("sq-eval"), "-m", m, "--tokenizer", t, "-f", f, "-c", "600", "--chunks", "1",
                              "--allow-long-context", "-q"});
  EXPECT_EQ(r.exit_status, 0) << r.err;
}

TEST(SqEval, BadHfCheckpointsGiveOneLineAndExit2) {
  ScratchDir dir;
  const std::string hf = dir.file("hf");
  save_hf_checkpoint(load_llama2c_checkpoint(stories_model()), hf, "F32");
  const std::string t = stories_tokenizer(), f = tinystories_valid(), json = dir.file("out.json");
  const std::string config = read_file(hf + "/config.json"), weights = read_file(hf + "/model.safetensors");
  auto with_config = [&](const std::string& from, const std::string& to) {
    std::string c = config;
    c.replace(c.find(from), from.size(), to);
    write_file(hf + "/config.json", c);
  };
  with_config("LlamaForCausalLM", "BertForMaskedLM");
  expect_one_line_error("sq-eval", {"-m", hf, "--tokenizer", t, "-f", f, "--json", json}, "BertForMaskedLM", dir);
  with_config("\"hidden_size\"", "\"hidden_sizes\"");
  expect_one_line_error("sq-eval", {"-m", hf, "--tokenizer", t, "-f", f, "--json", json}, "hidden_size", dir);
  write_file(hf + "/config.json", config);
  write_file(hf + "/model.safetensors", weights.substr(0, weights.size() - 1000));
  expect_one_line_error("sq-eval", {"-m", hf, "--tokenizer", t, "-f", f, "--json", json}, "model.safetensors", dir);
  std::string big_header = weights;
  big_header[5] = '\x7f';  // header length (u64 LE) now far larger than the file
  write_file(hf + "/model.safetensors", big_header);
  expect_one_line_error("sq-eval", {"-m", hf, "--tokenizer", t, "-f", f, "--json", json}, "model.safetensors", dir);
  write_file(hf + "/model.safetensors", weights);
  const auto ok = run_process({tool("sq-eval"), "-m", hf, "--tokenizer", t, "-f", f, "--chunks", "2", "-c", "128", "-q"});
  EXPECT_EQ(ok.exit_status, 0) << ok.err;
}

TEST(SqRun, BadInputsGiveOneLineAndExit2) {
  ScratchDir dir;
  const std::string m = stories_model(), t = stories_tokenizer();
  expect_one_line_error("sq-run", {"-m", m, "--tokenizer", t, "-p", "Hi", "--temp", "-1"}, "--temp must be >= 0", dir);
  expect_one_line_error("sq-run", {"-m", m, "--tokenizer", t, "-p", "Hi", "--top-p", "0"}, "--top-p must be in (0, 1]", dir);
  expect_one_line_error("sq-run", {"-m", m, "--tokenizer", t, "-p", "Hi", "-n", "-3"}, "-n must be >= 0", dir);
  expect_one_line_error("sq-run", {"-m", dir.file("missing"), "--tokenizer", t, "-p", "Hi"}, "cannot open", dir);
  const auto r = run_process({tool("sq-run"), "--bogus-flag"});
  EXPECT_EQ(r.exit_status, 2);
}

// sq-bench --suite streaming (issue #6 acceptance 4): both policies decode the same tokens as
// sq-eval --protocol streaming does. Speed is not asserted (no timed unit tests); the PPLs must be
// bit-identical to sq-eval's because the same deterministic code runs on the same tokens.
TEST(SqBench, StreamingSuiteDecodesTheSameTokensAsSqEval) {
  ScratchDir dir;
  const std::string m = stories_model(), t = stories_tokenizer();
  write_file(dir.file("text.txt"), read_file(tinystories_valid()).substr(0, 4000));  // ~1,000 tokens
  const auto r = run_process({tool("sq-bench"), "--suite", "streaming", "--eval-model", m, "--eval-tokenizer", t, "--eval-text",
                              dir.file("text.txt"), "--stream-tokens", "300", "--stream-sinks", "4", "--stream-window", "60",
                              "-t", "1", "--json", dir.file("bench.json")});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NE(r.out.find("StreamingLLM vs recompute"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(read_file(dir.file("bench.json")))["streaming"];
  EXPECT_EQ(j["tokens"], 300);
  EXPECT_EQ(j["predictions"], 299);
  EXPECT_EQ(j["threads"], 1);
  for (const char* p : {"sink:4,window:60", "recompute:64"}) {
    EXPECT_EQ(j[p]["peak_kv_tokens"], 64) << p;
    EXPECT_GT(j[p]["tokens_per_second"].get<double>(), 0.0) << p;
    const auto e = run_process({tool("sq-eval"), "-m", m, "--tokenizer", t, "-f", dir.file("text.txt"), "--protocol", "streaming",
                                "--kv-policy", p, "--max-tokens", "300", "-q", "--json", dir.file("eval.json"), "--force"});
    ASSERT_EQ(e.exit_status, 0) << e.err;
    const auto je = nlohmann::json::parse(read_file(dir.file("eval.json")));
    EXPECT_EQ(je["tokens_scored"], 299);
    EXPECT_EQ(j[p]["ppl"].get<double>(), je["ppl"].get<double>()) << p;  // same code, same tokens: exact
  }
  EXPECT_NEAR(j["speedup"].get<double>(),
              j["sink:4,window:60"]["tokens_per_second"].get<double>() / j["recompute:64"]["tokens_per_second"].get<double>(),
              1e-9 * j["speedup"].get<double>());  // the ratio is of the two reported rates (rounding only)
  expect_one_line_error("sq-bench", {"--suite", "streaming", "--eval-text", dir.file("text.txt")}, "needs --eval-model", dir);
  expect_one_line_error("sq-bench", {"--suite", "streaming", "--eval-model", m, "--eval-tokenizer", t, "--eval-text",
                                     dir.file("text.txt"), "--stream-sinks", "8", "--stream-window", "8"},
                        "must be smaller than window", dir);
}

// sq-bench --suite real (issue 19): every variant is timed (speed itself is not asserted: no timed
// unit tests), the reported ratios are those of the reported rates, and the FP32 eval row is
// sq-eval's own perplexity on the same chunks (same code, same tokens: exact).
TEST(SqBench, RealSuiteTimesEveryVariantAndItsEvalIsSqEvals) {
  ScratchDir dir;
  const std::string m = stories_model(), t = stories_tokenizer();
  write_file(dir.file("text.txt"), read_file(tinystories_valid()).substr(0, 4000));  // ~1,000 tokens
  const auto r = run_process({tool("sq-bench"), "--suite", "real", "-m", m, "--eval-tokenizer", t, "--eval-text", dir.file("text.txt"),
                              "-p", "32", "-n", "8", "--eval-ctx", "64", "--eval-chunks", "3", "--group-size", "32",
                              "--min-seconds", "0.01", "-t", "1", "--json", dir.file("bench.json")});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NE(r.out.find("of the sgemm bound"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(read_file(dir.file("bench.json")))["real"];
  EXPECT_EQ(j["prompt_tokens"], 32);
  EXPECT_EQ(j["gen_tokens"], 8);
  EXPECT_GT(j["sgemm_bound"]["tokens_per_second"].get<double>(), 0.0);
  const auto& v = j["variants"];
  std::vector<std::string> names = {"fp32", "w8a8-o1-head", "w4a16-g32", "w4a16-g32-head"};
  if (w4_int8_decode_supported()) names.push_back("w4a16-g32-head-a8");
  ASSERT_EQ(v.size(), names.size());
  const double fp32_ppl = v[0]["eval_ppl"].get<double>();
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i]["name"], names[i]);
    for (const char* k : {"pp", "tg", "eval"}) {
      const double tps = v[i][std::string(k) + "_tokens_per_second"].get<double>();
      EXPECT_GT(tps, 0.0) << names[i] << " " << k;
      const double ratio = v[i][std::string(k) + "_ratio_to_fp32"].get<double>();
      EXPECT_NEAR(ratio, tps / v[0][std::string(k) + "_tokens_per_second"].get<double>(), 1e-9 * ratio) << names[i] << " " << k;
    }
    // Quantized stories260K stays a language model: finite PPL within 2x of FP32 (measured ~1.01-1.3x).
    const double ppl = v[i]["eval_ppl"].get<double>();
    EXPECT_TRUE(std::isfinite(ppl)) << names[i];
    EXPECT_LT(ppl, 2 * fp32_ppl) << names[i];
  }
  const auto e = run_process({tool("sq-eval"), "-m", m, "--tokenizer", t, "-f", dir.file("text.txt"), "--protocol", "llamacpp", "-c", "64",
                              "--chunks", "3", "-t", "1", "-q", "--json", dir.file("eval.json")});
  ASSERT_EQ(e.exit_status, 0) << e.err;
  EXPECT_EQ(fp32_ppl, nlohmann::json::parse(read_file(dir.file("eval.json")))["ppl"].get<double>());
  expect_one_line_error("sq-bench", {"--suite", "real"}, "needs -m MODEL", dir);
  expect_one_line_error("sq-bench", {"--suite", "real", "-m", m, "-p", "0"}, "must be >= 1", dir);
  // --variants: fp32 (the ratio base) and the named ones only; an unknown name lists the known ones.
  const auto only = run_process({tool("sq-bench"), "--suite", "real", "-m", m, "-p", "8", "-n", "2", "--group-size", "32",
                                 "--variants", "w4a16-g32", "--min-seconds", "0.01", "-t", "1", "--json", dir.file("only.json")});
  ASSERT_EQ(only.exit_status, 0) << only.err;
  const auto ov = nlohmann::json::parse(read_file(dir.file("only.json")))["real"]["variants"];
  ASSERT_EQ(ov.size(), 2u);
  EXPECT_EQ(ov[0]["name"], "fp32");
  EXPECT_EQ(ov[1]["name"], "w4a16-g32");
  expect_one_line_error("sq-bench", {"--suite", "real", "-m", m, "--variants", "w4a16-g7"}, "expected some of: fp32, w8a8-o1-head", dir);
}

// sq-tokenize: llama-tokenize's output format, the id list, BOS overrides, bad inputs.
TEST(SqTokenize, PrintsIdsAndPiecesLikeLlamaTokenize) {
  const auto r = run_process({tool("sq-tokenize"), "-m", llama2_tokenizer(), "-p", "Hello world"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_EQ(r.out, "     1 -> '<s>'\n 15043 -> ' Hello'\n  3186 -> ' world'\n");
  const auto ids = run_process({tool("sq-tokenize"), "-m", stories_tokenizer(), "-p", "Once upon a time", "--ids"});
  ASSERT_EQ(ids.exit_status, 0) << ids.err;
  EXPECT_EQ(ids.out, "[1, 403, 407, 261, 378]\n");
  const auto no_bos = run_process({tool("sq-tokenize"), "-m", stories_tokenizer(), "-p", "Once upon a time", "--ids", "--no-bos"});
  EXPECT_EQ(no_bos.out, "[403, 407, 261, 378]\n");
}

TEST(SqTokenize, BadInputsGiveOneLineAndExit2) {
  ScratchDir dir;
  expect_one_line_error("sq-tokenize", {"-m", dir.file("missing"), "-p", "Hi"}, "cannot open", dir);
  expect_one_line_error("sq-tokenize", {"-m", stories_tokenizer()}, "give the text with -p TEXT or -f FILE", dir);
  expect_one_line_error("sq-tokenize", {"-m", stories_tokenizer(), "-p", "a", "-f", "b"}, "excludes", dir);
  expect_one_line_error("sq-tokenize", {"-m", tinystories_valid(), "-p", "Hi"}, "not a tokenizer", dir);
  expect_one_line_error("sq-tokenize", {"-m", stories_tokenizer(), "-f", dir.file("missing.txt")}, "cannot open", dir);
}

}  // namespace
}  // namespace sq::test
