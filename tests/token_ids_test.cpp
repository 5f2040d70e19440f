// Issue 16, last Design bullet: pre-tokenized input (`--token-ids FILE`) on sq-eval, sq-calibrate and
// sq-run. The reader (formats/token_ids_file.h) on both formats and every bad input; through the
// tools on stories260K: the same PPL/NLL as the same text tokenized, the windows protocol with
// -c T = number of ids scoring T−1 predictions whose mean NLL equals one computed here from a Decoder
// forward, the same greedy continuation as the text prompt, the same calibration statistics as the
// text; and a checkpoint without a tokenizer (hf-tiny llama-gqa) evaluated, run and calibrated on
// its reference input_ids.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "calib/activation_stats.h"
#include "core/error.h"
#include "formats/calibration_h5.h"
#include "formats/npy_file.h"
#include "formats/safetensors.h"
#include "formats/token_ids_file.h"
#include "formats/tokenizer.h"
#include "model/decoder.h"
#include "model/model_loader.h"
#include "runtime/kv_cache.h"
#include "tests/support/cli.h"
#include "tests/support/expect_error.h"
#include "tests/support/process.h"
#include "tests/support/test_data.h"

namespace sq::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- the reader ----

std::vector<int32_t> parse(const std::string& text, int64_t vocab = 0) { return parse_token_ids(text, "ids.txt", vocab); }

TEST(TokenIdsReader, WhitespaceSeparated) {
  EXPECT_EQ(parse("1 2\n3\t4\r\n  5\v6\f7"), (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(parse("0"), (std::vector<int32_t>{0}));
  EXPECT_EQ(parse("007 10\n"), (std::vector<int32_t>{7, 10}));
  EXPECT_EQ(parse("2147483647"), (std::vector<int32_t>{2147483647}));
  EXPECT_EQ(parse("511 0", 512), (std::vector<int32_t>{511, 0}));
}

TEST(TokenIdsReader, JsonArray) {
  EXPECT_EQ(parse("[1, 2,3 ]"), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse("\n  [\n 4 ,\n 5\n]\n\n"), (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(parse("[0]"), (std::vector<int32_t>{0}));
}

TEST(TokenIdsReader, ReadsAFile) {
  ScratchDir dir;
  write_file(dir.file("a.txt"), "1 2 3\n");
  write_file(dir.file("b.json"), "[1,2,3]");
  EXPECT_EQ(read_token_ids_file(dir.file("a.txt")), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(read_token_ids_file(dir.file("b.json"), 4), (std::vector<int32_t>{1, 2, 3}));
  expect_error<InputError>([&] { read_token_ids_file(dir.file("missing.txt")); }, {"cannot open", dir.file("missing.txt")});
  expect_error<InputError>([&] { read_token_ids_file(dir.path()); }, {"cannot open", "not a regular file"});
}

TEST(TokenIdsReader, BadInputIsAnInputErrorNamingFileAndPosition) {
  struct Case {
    std::string text;
    int64_t vocab;
    std::string message;  // the whole what()
  };
  const std::vector<Case> cases = {
      {"", 0, "ids.txt: no token ids (the file is empty)"},
      {" \n\t\n", 0, "ids.txt: no token ids (the file holds only whitespace)"},
      {"[]", 0, "ids.txt: no token ids (the JSON array is empty)"},
      {" [ ]\n", 0, "ids.txt: no token ids (the JSON array is empty)"},
      {"1 x 3", 0, "ids.txt: the token id at position 1 (byte offset 2) is not a non-negative integer: 'x'"},
      {"1 2.5", 0, "ids.txt: the token id at position 1 (byte offset 2) is not a non-negative integer: '2.5'"},
      {"1 +2", 0, "ids.txt: the token id at position 1 (byte offset 2) is not a non-negative integer: '+2'"},
      {"1,2", 0, "ids.txt: the token id at position 0 (byte offset 0) is not a non-negative integer: '1,2'"},
      {"5 6 -3", 0, "ids.txt: token id -3 at position 2 is negative"},
      {"1 600", 512, "ids.txt: token id 600 at position 1 is outside the model's vocabulary of 512 ids (0..511)"},
      {"512", 512, "ids.txt: token id 512 at position 0 is outside the model's vocabulary of 512 ids (0..511)"},
      {"1 99999999999", 0, "ids.txt: token id 99999999999 at position 1 is larger than 2147483647"},
      {"[1, -2]", 0, "ids.txt: token id -2 at position 1 is negative"},
      {"[1, 2.0]", 0, "ids.txt: the token id at position 1 (byte offset 4) is not a non-negative integer: '2.0'"},
      {"[1, 1e3]", 0, "ids.txt: the token id at position 1 (byte offset 4) is not a non-negative integer: '1e3'"},
      {"[1, \"a\"]", 0, "ids.txt: the token id at position 1 (byte offset 4) is not a non-negative integer: '\"a\"'"},
      {"[null]", 0, "ids.txt: the token id at position 0 (byte offset 1) is not a non-negative integer: 'null'"},
      {"[[1]]", 0, "ids.txt: the token id at position 0 (byte offset 1) is not a non-negative integer: '[1'"},
      {"[7, 320]", 320, "ids.txt: token id 320 at position 1 is outside the model's vocabulary of 320 ids (0..319)"},
      {"[1 2]", 0, "ids.txt: not a JSON array of integers: expected ',' or ']' after position 0 at byte offset 3"},
      {"[1, 2", 0, "ids.txt: not a JSON array of integers: no closing ']'"},
      {"[1, 2,", 0, "ids.txt: not a JSON array of integers: no closing ']'"},
      {"[1,]", 0, "ids.txt: not a JSON array of integers: expected a token id at byte offset 3"},
      {"[,1]", 0, "ids.txt: not a JSON array of integers: expected a token id at byte offset 1"},
      {"[1] 2", 0, "ids.txt: not a JSON array of integers: text after the closing ']' at byte offset 4"},
      {"[] x", 0, "ids.txt: not a JSON array of integers: text after the closing ']' at byte offset 3"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("input: " + c.text);
    const std::string msg = expect_error<InputError>([&] { parse(c.text, c.vocab); });
    EXPECT_EQ(msg, c.message);
  }
  expect_error<InputError>([] { check_token_ids_in_vocabulary({0, 3, 9}, 9, "f.txt"); },
                           {"f.txt: token id 9 at position 2 is outside the model's vocabulary of 9 ids (0..8)"});
  check_token_ids_in_vocabulary({0, 8}, 9, "f.txt");  // no throw
}

// ---- through the tools ----

std::string join(const std::vector<int32_t>& ids, const char* sep) {
  std::ostringstream s;
  for (size_t i = 0; i < ids.size(); ++i) s << (i ? sep : "") << ids[i];
  return s.str();
}
std::string as_whitespace(const std::vector<int32_t>& ids) { return join(ids, " ") + "\n"; }
std::string as_json(const std::vector<int32_t>& ids) {
  std::string s = "[";
  s += join(ids, ", ");
  s += "]\n";
  return s;
}

/// The stories260K token ids of `text` as sq-eval and sq-run encode it (BOS when the tokenizer adds one).
std::vector<int32_t> stories_ids(const std::string& text) {
  const auto tok = load_tokenizer(stories_tokenizer());
  const std::vector<int> ids = tok->encode(text, tok->default_add_bos(), false);
  return {ids.begin(), ids.end()};
}

/// Mean over positions 0..T−2 of the NLL of ids[t+1] under logits [T, vocab] (log-sum-exp in double).
double nll_mean_of_logits(const float* logits, const std::vector<int32_t>& ids, int64_t vocab) {
  double sum = 0.0;
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* row = logits + static_cast<int64_t>(t) * vocab;
    const double m = *std::max_element(row, row + vocab);
    double z = 0.0;
    for (int64_t v = 0; v < vocab; ++v) z += std::exp(double(row[v]) - m);
    sum += m + std::log(z) - double(row[ids[t + 1]]);
  }
  return sum / static_cast<double>(ids.size() - 1);
}

json run_json(std::vector<std::string> argv) {
  argv.insert(argv.end(), {"-q", "--json", "-"});
  const ProcessResult r = run_process(argv);
  EXPECT_EQ(r.exit_status, 0) << r.err;
  if (r.exit_status != 0) return json::object();
  return json::parse(r.out);
}

/// Mean next-token NLL (nats) over predictions 0..T−2 of `ids`, from one Decoder forward of all T
/// tokens; log-sum-exp in double here (sq-eval's uses fast_exp with FP32 block sums).
double decoder_nll_mean(const Decoder& model, const std::vector<int32_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size()), vocab = model.config().vocab_size;
  KVCache cache(model.config(), n);
  Workspace ws;
  std::vector<float> logits(static_cast<size_t>(n * vocab));
  model.forward(ids.data(), n, cache, ws, logits.data(), LogitsFor::AllTokens);
  return nll_mean_of_logits(logits.data(), ids, vocab);
}

TEST(TokenIdsTools, SqEvalOnIdsEqualsSqEvalOnTheSameTextTokenized) {
  ScratchDir dir;
  const std::string text = read_file(tinystories_valid()).substr(0, 4000);
  write_file(dir.file("short.txt"), text);
  const std::vector<int32_t> ids = stories_ids(text);
  ASSERT_GT(ids.size(), 700u);
  write_file(dir.file("ids.txt"), as_whitespace(ids));
  write_file(dir.file("ids.json"), as_json(ids));
  const std::vector<std::string> base = {tool("sq-eval"), "-m", stories_model(), "-c", "128"};
  for (const char* protocol : {"windows", "llamacpp"}) {
    SCOPED_TRACE(protocol);
    auto with = [&](std::vector<std::string> extra) {
      std::vector<std::string> a = base;
      a.insert(a.end(), {"--protocol", protocol});
      a.insert(a.end(), extra.begin(), extra.end());
      return run_json(a);
    };
    const json t = with({"--tokenizer", stories_tokenizer(), "-f", dir.file("short.txt")});
    // llamacpp replaces each chunk's first id by BOS when the tokenizer adds BOS: give it the tokenizer.
    const json w = with({"--tokenizer", stories_tokenizer(), "--token-ids", dir.file("ids.txt")});
    const json a = with({"--tokenizer", stories_tokenizer(), "--token-ids", dir.file("ids.json")});
    ASSERT_TRUE(t.contains("ppl") && w.contains("ppl") && a.contains("ppl"));
    EXPECT_EQ(t["text"]["tokens"].get<int64_t>(), int64_t(ids.size()));
    EXPECT_EQ(w["token_ids"]["tokens"].get<int64_t>(), int64_t(ids.size()));
    EXPECT_EQ(w["token_ids"]["path"].get<std::string>(), dir.file("ids.txt"));
    EXPECT_FALSE(w.contains("text"));
    for (const json* j : {&w, &a}) {  // exactly the same numbers
      EXPECT_EQ((*j)["ppl"].get<double>(), t["ppl"].get<double>());
      EXPECT_EQ((*j)["nll_mean"].get<double>(), t["nll_mean"].get<double>());
      EXPECT_EQ((*j)["ppl_stderr"].get<double>(), t["ppl_stderr"].get<double>());
      EXPECT_EQ((*j)["tokens_scored"].get<int64_t>(), t["tokens_scored"].get<int64_t>());
      EXPECT_EQ((*j)["protocol"]["chunks"].get<int64_t>(), t["protocol"]["chunks"].get<int64_t>());
    }
    EXPECT_EQ(t["tokens_scored"].get<int64_t>(), (int64_t(ids.size()) / 128) * (std::string(protocol) == "windows" ? 127 : 63));
  }
  // windows needs no tokenizer at all for ids (stories260K.bin has none beside it): same numbers.
  const json plain = run_json({tool("sq-eval"), "-m", stories_model(), "-c", "128", "--token-ids", dir.file("ids.txt")});
  const json t = run_json({tool("sq-eval"), "-m", stories_model(), "-c", "128", "--tokenizer", stories_tokenizer(), "-f",
                           dir.file("short.txt")});
  EXPECT_EQ(plain.value("ppl", 0.0), t.value("ppl", -1.0));
  // streaming too
  const json st = run_json({tool("sq-eval"), "-m", stories_model(), "--protocol", "streaming", "--kv-policy", "sink:4,window:60",
                            "--max-tokens", "300", "--token-ids", dir.file("ids.json")});
  const json ss = run_json({tool("sq-eval"), "-m", stories_model(), "--protocol", "streaming", "--kv-policy", "sink:4,window:60",
                            "--max-tokens", "300", "--tokenizer", stories_tokenizer(), "-f", dir.file("short.txt")});
  EXPECT_EQ(st.value("nll_mean", 0.0), ss.value("nll_mean", -1.0));
  EXPECT_EQ(st.value("tokens_scored", 0), 299);
}

TEST(TokenIdsTools, WindowsWithCtxEqualToTheIdCountScoresTMinus1AndReportsTheirMeanNll) {
  ScratchDir dir;
  const std::string text = read_file(tinystories_valid()).substr(0, 2000);
  std::vector<int32_t> ids = stories_ids(text);
  ids.resize(200);  // T = 200 ids, -c 200
  write_file(dir.file("ids.txt"), as_whitespace(ids));
  const json j = run_json({tool("sq-eval"), "-m", stories_model(), "--token-ids", dir.file("ids.txt"), "-c", "200"});
  ASSERT_TRUE(j.contains("nll_mean"));
  EXPECT_EQ(j["tokens_scored"].get<int64_t>(), 199);
  EXPECT_EQ(j["protocol"]["chunks"].get<int64_t>(), 1);
  EXPECT_EQ(j["protocol"]["name"].get<std::string>(), "windows");
  const LoadedModel m = load_model(stories_model());
  const double want = decoder_nll_mean(*m.model, ids);
  // sq-eval's log-sum-exp uses fast_exp summed in FP32 blocks of 64 (~1e-7 relative on the sum): a
  // per-token difference of ~1e-6 nats at most, far below 1e-5.
  EXPECT_NEAR(j["nll_mean"].get<double>(), want, 1e-5);
  EXPECT_NEAR(j["ppl"].get<double>(), std::exp(want), std::exp(want) * 1e-5);
  std::printf("stories260K, 200 ids, -c 200: nll_mean %.9f (Decoder forward here %.9f), ppl %.6f\n", j["nll_mean"].get<double>(),
              want, j["ppl"].get<double>());
}

/// transformers' reference of an hf-tiny checkpoint: input_ids [T] and logits [T, vocab].
struct TinyReference {
  std::vector<int32_t> ids;
  Tensor logits;
};
TinyReference tiny_reference(const std::string& name) {
  SafetensorsFile ref(shared_data("reference/hf-tiny/" + name + "/reference.safetensors"));
  TinyReference r;
  r.ids.resize(static_cast<size_t>(ref.shape("input_ids").at(0)));
  std::memcpy(r.ids.data(), ref.raw_data("input_ids"), r.ids.size() * sizeof(int32_t));
  r.logits = ref.load_f32("logits");
  return r;
}

TEST(TokenIdsTools, ACheckpointWithoutTokenizerEvaluatesRunsAndCalibratesOnIds) {
  const std::string model = shared_data("reference/hf-tiny/llama-gqa");
  ASSERT_FALSE(fs::exists(model + "/tokenizer.json") || fs::exists(model + "/tokenizer.model"));
  const TinyReference ref = tiny_reference("llama-gqa");
  const int64_t T = static_cast<int64_t>(ref.ids.size()), vocab = 320;
  ASSERT_EQ(T, 64);
  ScratchDir dir;
  write_file(dir.file("ids.json"), as_json(ref.ids));
  const json j = run_json({tool("sq-eval"), "-m", model, "--token-ids", dir.file("ids.json"), "-c", std::to_string(T)});
  ASSERT_TRUE(j.contains("nll_mean"));
  EXPECT_EQ(j["tokens_scored"].get<int64_t>(), T - 1);
  const LoadedModel m = load_model(model);
  const double mine = decoder_nll_mean(*m.model, ref.ids);
  EXPECT_NEAR(j["nll_mean"].get<double>(), mine, 1e-5);  // as above
  // and from transformers' own logits: sqkit's logits agree to ~2e-6 (rope_scaling_test bounds them by
  // 1e-4), so each NLL (a log-sum-exp minus one logit) to within 2e-4.
  const double theirs = nll_mean_of_logits(ref.logits.data(), ref.ids, vocab);
  EXPECT_NEAR(j["nll_mean"].get<double>(), theirs, 2e-4);
  std::printf("hf-tiny llama-gqa, 64 reference ids: nll_mean %.9f (Decoder here %.9f, transformers' logits %.9f)\n",
              j["nll_mean"].get<double>(), mine, theirs);

  // sq-run: the generated ids alone on stdout (no tokenizer), greedy = argmax of a Decoder forward.
  const ProcessResult r = run_process({tool("sq-run"), "-m", model, "--token-ids", dir.file("ids.json"), "-n", "1", "--temp", "0", "-q"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const float* last = ref.logits.data() + (T - 1) * vocab;
  EXPECT_EQ(r.out, std::to_string(std::max_element(last, last + vocab) - last) + "\n");
  const ProcessResult r8 = run_process({tool("sq-run"), "-m", model, "--token-ids", dir.file("ids.json"), "-n", "8", "--temp", "0", "-q"});
  ASSERT_EQ(r8.exit_status, 0) << r8.err;
  EXPECT_EQ(std::count(r8.out.begin(), r8.out.end(), '\n'), 1) << r8.out;
  EXPECT_EQ(parse_token_ids(r8.out, "stdout", vocab).size(), 8u) << r8.out;

  // sq-calibrate: windows cut from the ids, no tokenizer.
  const ProcessResult c = run_process({tool("sq-calibrate"), "-m", model, "--token-ids", dir.file("ids.json"), "--samples", "3",
                                       "--seq-len", "32", "-o", dir.file("calib.h5"), "-q"});
  ASSERT_EQ(c.exit_status, 0) << c.err;
  const CalibrationData data = read_calibration_h5(dir.file("calib.h5"));
  EXPECT_EQ(data.provenance.text_format, kTextFormatTokenIds);
  EXPECT_EQ(data.layers.at(0).inputs[0].tokens, 3 * 32);
}

/// Reads a float32 .npy file as written by write_npy_f32 (formats/npy_file.h): checks the magic,
/// version 1.0, the 64-byte alignment of the data and the dict text, and returns the values.
std::vector<float> read_npy_f32(const std::string& path, const std::string& shape_text) {
  const std::string bytes = read_file(path);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t hlen = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  EXPECT_EQ((10 + hlen) % 64, 0u);
  const std::string dict = bytes.substr(10, hlen);
  EXPECT_EQ(dict.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_text + ", }", 0), 0u) << dict;
  EXPECT_EQ(dict.back(), '\n');
  std::vector<float> v((bytes.size() - 10 - hlen) / 4);
  std::memcpy(v.data(), bytes.data() + 10 + hlen, v.size() * 4);
  return v;
}

TEST(TokenIdsTools, SqRunWritesThePromptLogitsAsNpy) {
  EXPECT_EQ(npy_header_f32({7}).substr(10), "{'descr': '<f4', 'fortran_order': False, 'shape': (7,), }" + std::string(60, ' ') + "\n");  // 10 + 57 + 60 + 1 = 128 bytes
  EXPECT_EQ(npy_header_f32({}).size() % 64, 0u);
  const std::string model = shared_data("reference/hf-tiny/llama-gqa");
  const TinyReference ref = tiny_reference("llama-gqa");
  const int64_t T = static_cast<int64_t>(ref.ids.size()), vocab = 320;
  ScratchDir dir;
  write_file(dir.file("ids.json"), as_json(ref.ids));
  const ProcessResult r = run_process({tool("sq-run"), "-m", model, "--token-ids", dir.file("ids.json"), "-n", "0", "-q",
                                       "--logits", dir.file("logits.npy")});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_EQ(r.out, "");  // -n 0 with --logits: nothing generated, nothing printed
  const std::vector<float> got = read_npy_f32(dir.file("logits.npy"), "(" + std::to_string(T) + ", 320)");
  ASSERT_EQ(static_cast<int64_t>(got.size()), T * vocab);
  // transformers' logits of the same ids: sqkit's FP32 forward agrees to ~2e-6 (docs/benchmarks.md
  // "Architectures"); 1e-4 leaves room for summation order and still catches a misplaced row.
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - ref.logits.data()[i])));
  EXPECT_LT(worst, 1e-4);
  // An existing file is refused before any work (exit 2) and left alone; --force replaces it.
  write_file(dir.file("old.npy"), "keep");
  const ProcessResult again = run_process({tool("sq-run"), "-m", model, "--token-ids", dir.file("ids.json"), "-n", "0", "-q",
                                           "--logits", dir.file("old.npy")});
  EXPECT_EQ(again.exit_status, 2);
  EXPECT_EQ(read_file(dir.file("old.npy")), "keep");
  const ProcessResult forced = run_process({tool("sq-run"), "-m", model, "--token-ids", dir.file("ids.json"), "-n", "0", "-q",
                                            "--logits", dir.file("old.npy"), "--force"});
  EXPECT_EQ(forced.exit_status, 0) << forced.err;
  EXPECT_EQ(read_npy_f32(dir.file("old.npy"), "(" + std::to_string(T) + ", 320)"), got);
}

TEST(TokenIdsTools, SqRunOnIdsGeneratesTheSameContinuationAsTheTextPrompt) {
  ScratchDir dir;
  const std::string prompt = "Once upon a time";
  const std::vector<int32_t> ids = stories_ids(prompt);
  write_file(dir.file("prompt.json"), as_json(ids));
  const std::vector<std::string> common = {"-n", "40", "--temp", "0", "-q"};
  auto run = [&](std::vector<std::string> a) {
    a.insert(a.begin(), {tool("sq-run"), "-m", stories_model()});
    a.insert(a.end(), common.begin(), common.end());
    return run_process(a);
  };
  const ProcessResult t = run({"--tokenizer", stories_tokenizer(), "-p", prompt});
  const ProcessResult i = run({"--token-ids", dir.file("prompt.json")});  // no tokenizer: ids only
  const ProcessResult it = run({"--token-ids", dir.file("prompt.json"), "--tokenizer", stories_tokenizer()});
  ASSERT_EQ(t.exit_status, 0) << t.err;
  ASSERT_EQ(i.exit_status, 0) << i.err;
  ASSERT_EQ(it.exit_status, 0) << it.err;
  ASSERT_EQ(std::count(i.out.begin(), i.out.end(), '\n'), 1) << i.out;
  const std::vector<int32_t> gen = parse_token_ids(i.out, "stdout", 512);
  EXPECT_EQ(gen.size(), 40u);
  // The generated ids decode to exactly the text run's continuation.
  const auto tok = load_tokenizer(stories_tokenizer());
  std::vector<int> all(ids.begin(), ids.end());
  all.insert(all.end(), gen.begin(), gen.end());
  std::string continuation;
  for (size_t k = ids.size(); k < all.size(); ++k) continuation += tok->decode_token(all[k - 1], all[k]);
  EXPECT_EQ(t.out, prompt + continuation + "\n");
  // With a tokenizer: the same ids line, then the prompt and continuation decoded = the text run's stdout.
  EXPECT_EQ(it.out, i.out + t.out);
  std::printf("sq-run --token-ids %s -> %s", as_json(ids).c_str(), i.out.c_str());
}

TEST(TokenIdsTools, SqCalibrateOnIdsRecordsTheSameStatisticsAsTheTextAndSqConvertRedrawsWithoutTokenizer) {
  ScratchDir dir;
  const std::string text = read_file(shared_data("tinystories/tinystories-train-2MiB.txt")).substr(0, 20000);
  write_file(dir.file("calib.txt"), text);
  // A plain text under 16 MiB is one document: one BOS, then the text (docs/formats.md).
  write_file(dir.file("calib.ids"), as_whitespace(stories_ids(text)));
  const std::vector<std::string> common = {"--samples", "6", "--seq-len", "64", "-s", "7", "-q"};
  auto calibrate = [&](std::vector<std::string> a, const std::string& out) {
    a.insert(a.begin(), {tool("sq-calibrate"), "-m", stories_model()});
    a.insert(a.end(), common.begin(), common.end());
    a.insert(a.end(), {"-o", out});
    return run_process(a);
  };
  const ProcessResult t = calibrate({"--tokenizer", stories_tokenizer(), "-f", dir.file("calib.txt")}, dir.file("text.h5"));
  const ProcessResult i = calibrate({"--token-ids", dir.file("calib.ids")}, dir.file("ids.h5"));
  ASSERT_EQ(t.exit_status, 0) << t.err;
  ASSERT_EQ(i.exit_status, 0) << i.err;
  const CalibrationData a = read_calibration_h5(dir.file("text.h5"));
  const CalibrationData b = read_calibration_h5(dir.file("ids.h5"));
  EXPECT_EQ(a.provenance.text_format, "");
  EXPECT_EQ(b.provenance.text_format, kTextFormatTokenIds);
  EXPECT_EQ(b.provenance.text_path, fs::canonical(dir.file("calib.ids")).string());
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l)
    for (size_t s = 0; s < a.layers[l].inputs.size(); ++s) {
      EXPECT_EQ(a.layers[l].inputs[s].tokens, b.layers[l].inputs[s].tokens);
      EXPECT_EQ(a.layers[l].inputs[s].absmax, b.layers[l].inputs[s].absmax) << "layer " << l << " site " << s;
      EXPECT_EQ(a.layers[l].inputs[s].sum_sq, b.layers[l].inputs[s].sum_sq) << "layer " << l << " site " << s;
    }
  // sq-convert re-draws the windows from the ids (--alpha auto), with no tokenizer anywhere.
  const ProcessResult c = run_process({tool("sq-convert"), "-m", stories_model(), "--calib", dir.file("ids.h5"), "--alpha", "auto",
                                       "--preset", "O1", "-o", dir.file("ids.sqm"), "-q"});
  EXPECT_EQ(c.exit_status, 0) << c.err;
  // ... and with the text calibration it needs the tokenizer to do the same: both choose the same α.
  const ProcessResult ct = run_process({tool("sq-convert"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "--calib",
                                        dir.file("text.h5"), "--alpha", "auto", "--preset", "O1", "-o", dir.file("text.sqm"), "-q"});
  EXPECT_EQ(ct.exit_status, 0) << ct.err;
  const json hi = json::parse(run_process({tool("sq-inspect"), "--json", dir.file("ids.sqm")}).out, nullptr, false);
  const json ht = json::parse(run_process({tool("sq-inspect"), "--json", dir.file("text.sqm")}).out, nullptr, false);
  ASSERT_FALSE(hi.is_discarded() || ht.is_discarded());
  const json& qi = hi["header"]["quantization"]["smoothing"]["groups"];
  const json& qt = ht["header"]["quantization"]["smoothing"]["groups"];
  ASSERT_TRUE(qi.is_array() && !qi.empty()) << hi.dump();
  EXPECT_EQ(qi, qt);
}

TEST(TokenIdsTools, BadInputIsOneLineExit2AndNoOutput) {
  ScratchDir dir;
  write_file(dir.file("ok.txt"), "1 2 3 4 5 6 7 8\n");
  write_file(dir.file("neg.txt"), "1 2 -4 5\n");
  write_file(dir.file("float.json"), "[1, 2, 3.5]");
  write_file(dir.file("big.txt"), "1 2 3 512 4\n");
  write_file(dir.file("empty.txt"), "");
  write_file(dir.file("text.txt"), "Once upon a time there was a dog.\n");
  const std::string json_out = dir.file("out.json"), h5_out = dir.file("out.h5");
  struct ToolCase {
    std::string name;
    std::vector<std::string> argv;  // before the input options
    std::string out;                // output file that must not appear ("" for sq-run)
    std::vector<std::string> text;  // the tool's text input options
  };
  const std::vector<ToolCase> tools = {
      {"sq-eval", {tool("sq-eval"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-c", "4", "-q", "--json", json_out},
       json_out, {"-f", dir.file("text.txt")}},
      {"sq-calibrate", {tool("sq-calibrate"), "-m", stories_model(), "--samples", "2", "--seq-len", "4", "-q", "-o", h5_out}, h5_out,
       {"-f", dir.file("text.txt")}},
      {"sq-run", {tool("sq-run"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-n", "2", "-q"}, "", {"-p", "Once"}},
  };
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  for (const ToolCase& t : tools) {
    SCOPED_TRACE(t.name);
    // Sanity: the good file works (so that each failure below is the input's).
    const ProcessResult ok = run_process(with(t.argv, {"--token-ids", dir.file("ok.txt")}));
    EXPECT_EQ(ok.exit_status, 0) << ok.err;
    if (!t.out.empty()) fs::remove(t.out);
    expect_one_line_exit2(run_process(with(with(t.argv, t.text), {"--token-ids", dir.file("ok.txt")})), "not both", t.out);
    expect_one_line_exit2(run_process(t.argv), "--token-ids FILE", t.out);
    expect_one_line_exit2(run_process(with(t.argv, {"--token-ids", dir.file("neg.txt")})),
                          t.name + ": error: " + dir.file("neg.txt") + ": token id -4 at position 2 is negative", t.out);
    expect_one_line_exit2(run_process(with(t.argv, {"--token-ids", dir.file("float.json")})),
                          dir.file("float.json") + ": the token id at position 2 (byte offset 7) is not a non-negative integer: '3.5'",
                          t.out);
    expect_one_line_exit2(run_process(with(t.argv, {"--token-ids", dir.file("big.txt")})),
                          dir.file("big.txt") + ": token id 512 at position 3 is outside the model's vocabulary of 512 ids (0..511)",
                          t.out);
    expect_one_line_exit2(run_process(with(t.argv, {"--token-ids", dir.file("empty.txt")})),
                          dir.file("empty.txt") + ": no token ids (the file is empty)", t.out);
    expect_one_line_exit2(run_process(with(t.argv, {"--token-ids", dir.file("missing.txt")})),
                          "cannot open " + dir.file("missing.txt"), t.out);
  }
}

}  // namespace
}  // namespace sq::test
