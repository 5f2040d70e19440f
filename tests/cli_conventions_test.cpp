// Issue #14 (trust audit), points 2, 6, 7, 9 and 10: every tool output is protected (never an
// input, never an existing file without --force, checked before any work), degenerate runs are
// errors, text that is not UTF-8 is flagged, the command lines follow one convention (one-line
// parse errors, --version, --json [FILE], llama.cpp spellings), and temporaries left by killed
// writers are cleaned up. Each test failed on the main branch before these changes.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "formats/atomic_file.h"
#include "formats/utf8.h"
#include "tests/support/cli.h"
#include "tests/support/process.h"
#include "tests/support/test_data.h"
#include "tool_cli.h"

namespace sq::test {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kTools = {"sq-eval", "sq-run", "sq-calibrate", "sq-convert", "sq-inspect", "sq-bench"};

/// A short evaluation text (~1,000 stories260K tokens) in `dir`.
std::string short_text(const ScratchDir& dir) {
  const std::string path = dir.file("short.txt");
  write_file(path, read_file(tinystories_valid()).substr(0, 4000));
  return path;
}

std::vector<std::string> eval_cmd(const std::string& text) {
  return {tool("sq-eval"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-f", text, "-c", "64", "--chunks", "2", "-q"};
}

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// The pid of a process that existed and is gone (a reaped child), for stale-temporary names.
pid_t dead_pid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  return pid;
}

// ---- point 2: inputs overwritten by --json ----

TEST(JsonOutput, AWordAfterJsonIsNeverTakenAsTheOutputUnlessItEndsInDotJson) {
  ScratchDir dir;
  const std::string text = short_text(dir);
  const std::string before = read_file(text);
  // Today's main wrote the JSON over short.txt and exited 0. Now short.txt is an unexpected argument.
  const auto r = run_process(plus(eval_cmd(text), {"--json", text}));
  expect_one_line_exit2(r, "not expected: " + text + " (--json takes '-', a file name ending in .json, or --json=FILE)");
  EXPECT_EQ(read_file(text), before);
  // The explicit form names any file, and an input is refused even with --force.
  for (const std::string& input : {text, stories_model(), stories_tokenizer()}) {
    const std::string in_before = read_file(input);
    const auto e = run_process(plus(eval_cmd(text), {"--json=" + input, "--force"}));
    expect_one_line_exit2(e, "is one of the inputs");
    EXPECT_EQ(read_file(input), in_before) << input;
  }
}

TEST(JsonOutput, ExistingFileIsReplacedOnlyWithForce) {
  ScratchDir dir;
  const std::string text = short_text(dir), json = dir.file("eval.json");
  write_file(json, "keep me");
  expect_one_line_exit2(run_process(plus(eval_cmd(text), {"--json", json})), "exists; use --force");
  EXPECT_EQ(read_file(json), "keep me");
  const auto r = run_process(plus(eval_cmd(text), {"--json", json, "--force"}));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_GT(nlohmann::json::parse(read_file(json))["ppl"].get<double>(), 1.0);
}

TEST(JsonOutput, DashAndBareJsonWriteOnlyTheDocumentToStdout) {
  ScratchDir dir;
  const std::string text = short_text(dir);
  for (const std::vector<std::string>& form : {std::vector<std::string>{"--json", "-"}, std::vector<std::string>{"--json"}}) {
    const auto r = run_process(plus(eval_cmd(text), form));
    ASSERT_EQ(r.exit_status, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);  // throws (fails the test) if anything else is on stdout
    EXPECT_EQ(j["tokens_scored"], 2 * 63);
    EXPECT_NE(r.err.find("PPL"), std::string::npos) << r.err;  // the readable summary moved to stderr
  }
}

// Issue 37: sq-calibrate, sq-convert and sq-run report what they did with --json (FILE or -: then
// stdout holds the document alone), each report ending with the process's peak RSS.
TEST(JsonOutput, CalibrateConvertAndRunReportTheirFiguresAndPeakRss) {
  ScratchDir dir;
  const std::string text = short_text(dir), calib = dir.file("c.h5"), sqm = dir.file("m.sqm");
  const auto last_key = [](const nlohmann::ordered_json& j) { return j.items().begin() == j.items().end() ? "" : (--j.end()).key(); };
  const auto c = run_process({tool("sq-calibrate"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-f", text, "--samples", "3",
                              "--seq-len", "32", "-o", calib, "-q", "--json", "-"});
  ASSERT_EQ(c.exit_status, 0) << c.err;
  const auto cj = nlohmann::ordered_json::parse(c.out);  // throws (fails) if anything else is on stdout
  EXPECT_EQ(cj["tokens"], 3 * 32);
  EXPECT_EQ(cj["output_bytes"].get<int64_t>(), static_cast<int64_t>(fs::file_size(calib)));
  EXPECT_EQ(last_key(cj), "peak_rss_bytes");
  EXPECT_GT(cj["peak_rss_bytes"].get<int64_t>(), 1 << 20);
  EXPECT_NE(c.err.find("sq-calibrate: 3 windows"), std::string::npos) << c.err;  // the summary moved to stderr

  const auto v = run_process({tool("sq-convert"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "--scheme", "w8a8", "--calib",
                              calib, "-o", sqm, "-q", "--json", dir.file("v.json")});
  ASSERT_EQ(v.exit_status, 0) << v.err;
  const auto vj = nlohmann::ordered_json::parse(read_file(dir.file("v.json")));
  EXPECT_EQ(vj["file_bytes"].get<int64_t>(), static_cast<int64_t>(fs::file_size(sqm)));
  EXPECT_EQ(vj["scheme"], "w8a8");
  EXPECT_FALSE(vj["smoothing"].empty());  // α 0.5 per smoothed group
  EXPECT_EQ(last_key(vj), "peak_rss_bytes");

  // sq-run: the ids in the report are the ones printed without --json (greedy).
  const std::vector<std::string> run = {tool("sq-run"), "-m", sqm, "-p", "Once upon a time", "-n", "12", "--temp", "0", "--ignore-eos"};
  const auto plain = run_process(run);
  const auto r = run_process(plus(run, {"--json", "-"}));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const auto rj = nlohmann::ordered_json::parse(r.out);
  EXPECT_EQ(rj["generated_tokens"], 12);
  EXPECT_EQ(rj["generated_ids"].size(), 12u);
  EXPECT_EQ("Once upon a time" + rj["text"].get<std::string>() + "\n", plain.out);
  EXPECT_NE(r.err.find("Once upon a time"), std::string::npos) << r.err;  // the text itself went to stderr
  EXPECT_GT(rj["decode_tokens_per_second"].get<double>(), 0.0);
  EXPECT_EQ(last_key(rj), "peak_rss_bytes");
}

TEST(JsonOutput, SqInspectAndSqBenchFollowTheSameConvention) {
  ScratchDir dir;
  const std::string sqm = dir.file("m.sqm");
  ASSERT_EQ(convert_stories("f32", {}, sqm).exit_status, 0);
  // sq-inspect --json FILE.sqm: the .sqm is the input, JSON on stdout (as before).
  const auto a = run_process({tool("sq-inspect"), "--json", sqm});
  ASSERT_EQ(a.exit_status, 0) << a.err;
  EXPECT_EQ(nlohmann::json::parse(a.out)["tensor_count"].get<int>() > 0, true);
  // ... and --json FILE.json writes a file; the model is never a JSON target.
  ASSERT_EQ(run_process({tool("sq-inspect"), sqm, "--json", dir.file("i.json")}).exit_status, 0);
  EXPECT_EQ(nlohmann::json::parse(read_file(dir.file("i.json")))["file"], sqm);
  const std::string sqm_before = read_file(sqm);
  expect_one_line_exit2(run_process({tool("sq-inspect"), sqm, "--json=" + sqm, "--force"}), "is one of the inputs");
  EXPECT_EQ(read_file(sqm), sqm_before);
  // sq-bench: the benchmark's input text is protected too; --json - keeps stdout pure JSON.
  const std::string text = short_text(dir);
  const std::string text_before = read_file(text);
  const std::vector<std::string> bench = {tool("sq-bench"), "--suite", "kmeans", "--kmeans-values", "2000", "--min-seconds", "0.01",
                                          "--eval-text", text};
  expect_one_line_exit2(run_process(plus(bench, {"--json=" + text})), "is one of the inputs");
  EXPECT_EQ(read_file(text), text_before);
  const auto b = run_process(plus(bench, {"--json", "-"}));
  ASSERT_EQ(b.exit_status, 0) << b.err;
  EXPECT_TRUE(nlohmann::json::parse(b.out).contains("kmeans"));
}

// ---- point 6: outputs are checked before the work starts ----

TEST(OutputChecks, MissingOutputDirectoryIsFoundBeforeAnyWork) {
  ScratchDir dir;
  const std::string missing = dir.file("no-such-dir");
  // The model path does not exist either: the output is checked first, so the message names it. A
  // late check (today's main) would have failed on the model, or after a full run.
  const std::string no_model = dir.file("no-model.bin");
  const std::string text = short_text(dir);
  expect_one_line_exit2(run_process({tool("sq-calibrate"), "-m", no_model, "-f", text, "-o", missing + "/c.h5"}),
                        "does not exist");
  expect_one_line_exit2(run_process({tool("sq-convert"), "-m", no_model, "--scheme", "f32", "-o", missing + "/m.sqm"}),
                        "does not exist");
  expect_one_line_exit2(run_process({tool("sq-eval"), "-m", no_model, "-f", text, "--json", missing + "/e.json"}),
                        "does not exist");
  expect_one_line_exit2(run_process({tool("sq-bench"), "--suite", "kmeans", "--json", missing + "/b.json"}), "does not exist");
  expect_one_line_exit2(run_process({tool("sq-bench"), "--write-synthetic", missing + "/x/y"}), "does not exist");
  // A directory where a file is expected, and an existing calibration file without --force.
  expect_one_line_exit2(run_process({tool("sq-calibrate"), "-m", no_model, "-f", text, "-o", dir.path()}), "is a directory");
  write_file(dir.file("c.h5"), "old");
  expect_one_line_exit2(run_process({tool("sq-calibrate"), "-m", no_model, "-f", text, "-o", dir.file("c.h5")}),
                        "exists; use --force");
  EXPECT_EQ(read_file(dir.file("c.h5")), "old");
  EXPECT_FALSE(fs::exists(missing));
}

// ---- point 7: degenerate runs ----

TEST(DegenerateRuns, ZeroScoredTokensIsAnError) {
  ScratchDir dir;
  const std::string text = short_text(dir);
  // Today's main: "PPL -nan", exit 0.
  expect_one_line_exit2(run_process({tool("sq-eval"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-f", text, "-c",
                                     "2", "--protocol", "llamacpp", "-q"}),
                        "scores no token");
  expect_one_line_exit2(run_process({tool("sq-eval"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-f", text,
                                     "--protocol", "streaming", "--max-tokens", "1", "-q"}),
                        "fewer than one stream of 2");
  // The smallest context that scores a token still works: -c 3 scores one prediction per chunk.
  const auto ok = run_process({tool("sq-eval"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-f", text, "-c", "3",
                               "--protocol", "llamacpp", "--chunks", "5", "-q", "--json", "-"});
  ASSERT_EQ(ok.exit_status, 0) << ok.err;
  EXPECT_EQ(nlohmann::json::parse(ok.out)["tokens_scored"], 5);
}

TEST(DegenerateRuns, InvalidUtf8AndBinaryTextAreFlaggedWithTheByteOffset) {
  ScratchDir dir;
  std::string text = read_file(tinystories_valid()).substr(0, 3000);
  text[1234] = static_cast<char>(0xC3);  // a 2-byte lead followed by an ASCII byte: invalid at 1234
  text[1235] = 'x';
  write_file(dir.file("bad.txt"), text);
  const auto r = run_process({tool("sq-eval"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-f", dir.file("bad.txt"),
                              "-c", "64", "--chunks", "1", "-q"});
  ASSERT_EQ(r.exit_status, 0) << r.err;  // a warning, not an error (docs/reliability.md)
  EXPECT_NE(r.err.find("sq-eval: warning: " + dir.file("bad.txt") + ": not plain UTF-8 text: invalid UTF-8 at byte 1234"),
            std::string::npos)
      << r.err;
  // Binary input (a model file as "text") is flagged by sq-calibrate before it calibrates.
  const auto c = run_process({tool("sq-calibrate"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-f", stories_model(),
                              "--samples", "1", "--seq-len", "16", "-o", dir.file("c.h5"), "-q"});
  EXPECT_NE(c.err.find("sq-calibrate: warning: " + stories_model() + ": not plain UTF-8 text:"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("NUL byte at byte"), std::string::npos) << c.err;
  // Clean text gives no warning.
  const auto clean = run_process(eval_cmd(short_text(dir)));
  ASSERT_EQ(clean.exit_status, 0);
  EXPECT_EQ(clean.err.find("warning"), std::string::npos) << clean.err;
}

TEST(Utf8, FindInvalidUtf8FollowsUnicodeTable3_7) {
  EXPECT_EQ(find_invalid_utf8(""), -1);
  EXPECT_EQ(find_invalid_utf8("plain ascii\n"), -1);
  EXPECT_EQ(find_invalid_utf8("\xD0\x9F\xD1\x80\xE3\x81\x82\xF0\x9F\x98\x80"), -1);  // Cyrillic, Japanese, an emoji
  EXPECT_EQ(find_invalid_utf8("\xF4\x8F\xBF\xBF"), -1);                                // U+10FFFF, the last code point
  EXPECT_EQ(find_invalid_utf8("ab\x80"), 2);              // lone continuation byte
  EXPECT_EQ(find_invalid_utf8("a\xC0\xAF"), 1);           // overlong '/' (C0 is never valid)
  EXPECT_EQ(find_invalid_utf8("\xE0\x80\xAF"), 0);        // overlong 3-byte form
  EXPECT_EQ(find_invalid_utf8("x\xED\xA0\x80"), 1);       // surrogate U+D800
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0);    // U+110000
  EXPECT_EQ(find_invalid_utf8("ok\xE3\x81"), 2);          // truncated at the end
  EXPECT_EQ(find_invalid_utf8("\xF5\x80\x80\x80"), 0);    // F5 lead byte
  EXPECT_EQ(text_encoding_warning(std::string("a\0b", 3), "t"), "t: not plain UTF-8 text: NUL byte at byte 1 (a binary file?); its bytes are tokenized as they are");
}

// ---- point 9: command-line conventions ----

TEST(CliConventions, ParseErrorsAreOneLineWithTheToolPrefix) {
  for (const std::string& t : kTools) {
    const auto r = run_process({tool(t), "--no-such-option"});
    EXPECT_EQ(r.exit_status, 2) << t;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << t << ": " << r.err;
    EXPECT_EQ(r.err.rfind(t + ": error: ", 0), 0u) << r.err;
  }
  // An unknown option with all required ones present names the option.
  const auto r = run_process({tool("sq-inspect"), "x.sqm", "--no-such-option"});
  EXPECT_NE(r.err.find("--no-such-option"), std::string::npos) << r.err;
}

TEST(CliConventions, EveryToolPrintsItsVersion) {
  for (const std::string& t : kTools) {
    const auto r = run_process({tool(t), "--version"});
    EXPECT_EQ(r.exit_status, 0) << t;
    EXPECT_EQ(r.out, t + " (sqkit) " + SQ_VERSION + "\n");
  }
}

TEST(CliConventions, LlamaCppSpellingsWork) {
  ScratchDir dir;
  const std::string text = short_text(dir);
  // --ctx-size is -c.
  const auto a = run_process(plus(eval_cmd(text), {"--json", "-"}));
  const auto b = run_process({tool("sq-eval"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-f", text, "--ctx-size",
                              "64", "--chunks", "2", "-q", "--json", "-"});
  ASSERT_EQ(a.exit_status, 0);
  ASSERT_EQ(b.exit_status, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(a.out)["ppl"], nlohmann::json::parse(b.out)["ppl"]);
  // sq-run: -f reads the prompt from a file, -s is --seed.
  write_file(dir.file("prompt.txt"), "Once upon a time");
  const std::vector<std::string> run = {tool("sq-run"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-n", "20", "-q"};
  const auto p = run_process(plus(run, {"-p", "Once upon a time", "--temp", "0.8", "--seed", "5"}));
  const auto f = run_process(plus(run, {"-f", dir.file("prompt.txt"), "--temp", "0.8", "-s", "5"}));
  ASSERT_EQ(p.exit_status, 0) << p.err;
  ASSERT_EQ(f.exit_status, 0) << f.err;
  EXPECT_EQ(p.out, f.out);
  const auto g = run_process(plus(run, {"-f", dir.file("prompt.txt"), "--temp", "0.8", "-s", "6"}));
  EXPECT_NE(g.out, f.out);  // -s really sets the seed
  expect_one_line_exit2(run_process(plus(run, {})), "-p TEXT or -f FILE");
  expect_one_line_exit2(run_process(plus(run, {"-p", "x", "-f", dir.file("prompt.txt")})), "sq-run: error:");
}

TEST(CliConventions, SqInspectSaysWhatItAccepts) {
  ScratchDir dir;
  fs::create_directory(dir.file("hf"));
  write_file(dir.file("hf/config.json"), "{}");
  expect_one_line_exit2(run_process({tool("sq-inspect"), dir.file("hf")}),
                        "is a directory (a Hugging Face checkpoint); sq-inspect reads packed .sqm files");
  // GGUF files are summarized (GgufModelTiny.SqInspectSummarizesIt); a broken one gets the reader's message.
  write_file(dir.file("m.gguf"), std::string("GGUF\x09\0\0\0", 8) + std::string(64, '\0'));
  expect_one_line_exit2(run_process({tool("sq-inspect"), dir.file("m.gguf")}), "version 9");
  expect_one_line_exit2(run_process({tool("sq-inspect"), stories_model()}), "is not an sqkit .sqm file; sq-inspect reads");
}

TEST(CliConventions, NormalizeJsonArgs) {
  using V = std::vector<std::string>;
  EXPECT_EQ(normalize_json_args(V{"--json"}), V{"--json=-"});
  EXPECT_EQ(normalize_json_args(V{"--json", "-"}), V{"--json=-"});
  EXPECT_EQ(normalize_json_args(V{"--json", "out.JSON", "-q"}), (V{"--json=out.JSON", "-q"}));
  EXPECT_EQ(normalize_json_args(V{"--json", "model.sqm"}), (V{"--json=-", "model.sqm"}));
  EXPECT_EQ(normalize_json_args(V{"--json", "--force"}), (V{"--json=-", "--force"}));
  EXPECT_EQ(normalize_json_args(V{"--json=anything"}), V{"--json=anything"});
  EXPECT_EQ(normalize_json_args(V{"--", "--json", "x.json"}), (V{"--", "--json", "x.json"}));
}

// ---- point 10: temporaries left by killed writers ----

TEST(StaleTemporaries, DeadWritersTemporariesAreRemovedWhenWritingNextToThem) {
  ScratchDir dir;
  const std::string out = dir.file("model.sqm");
  const std::string stale = out + ".tmp-" + std::to_string(dead_pid()) + "-aB3dE9";
  const std::string live = out + ".tmp-" + std::to_string(getpid()) + "-zzzzzz";  // this test process is alive
  const std::string other = out + ".tmp-" + std::to_string(dead_pid()) + "-toolong1";  // not our pattern
  const std::string other_output = dir.file("other.sqm") + ".tmp-" + std::to_string(dead_pid()) + "-abcdef";
  for (const auto& p : {stale, live, other, other_output}) write_file(p, "partial");
  const auto r = convert_stories("f32", {}, out);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_TRUE(fs::exists(out));
  EXPECT_FALSE(fs::exists(stale));  // today's main kept it forever
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::exists(other_output));
  // The library call reports what it removed.
  const std::string stale2 = out + ".tmp-" + std::to_string(dead_pid()) + "-QQQQQQ";
  write_file(stale2, "x");
  EXPECT_EQ(remove_stale_temporaries(out), std::vector<std::string>{stale2});
}

}  // namespace
}  // namespace sq::test
