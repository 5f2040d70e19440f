// Issue 14, point 3: sq-convert re-reads the calibration text (--alpha auto, sequential GPTQ
// Hessians, Atom --clip search) the same way from any working directory. sq-calibrate records the
// text's absolute path; sq-convert takes --calib-text or that path (a relative one from an older file:
// beside the calibration file, then the working directory), always checks the recorded SHA-256, and
// never falls back silently when the text is missing (calib/calibration_text.h).
//
// The .sqm holds no timestamps or output paths (docs/formats.md), so "the same command gives the same
// file" is checked byte for byte; where two runs legitimately read the text from different places
// (the header's calibration.text names the file read; calibration.file_sha256 differs for a rewritten
// calibration file) the tensors are compared byte for byte and the headers without those keys.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/calibration_h5.h"
#include "formats/fingerprint.h"
#include "formats/sqm_file.h"
#include "tests/support/cli.h"
#include "tests/support/process.h"
#include "tests/support/test_data.h"

namespace sq {
namespace {

namespace fs = std::filesystem;
using test::ProcessResult;
using test::ScratchDir;

constexpr char kTrainText[] = "tinystories/tinystories-train-2MiB.txt";

/// The three conversions that re-read the calibration text, as (scheme, flags without --calib).
struct Recipe {
  const char* name;
  const char* scheme;
  std::vector<std::string> flags;
};
const std::vector<Recipe>& recipes() {
  static const std::vector<Recipe> r = {
      {"gptq", "w4a16", {"--gptq"}},  // --gptq-hessians auto (the default)
      {"alpha-auto", "w8a8", {"--alpha", "auto", "--alpha-windows", "2"}},
      {"clip-search", "w4a4-atom", {"--clip", "search", "--group-size", "32"}},
  };
  return r;
}

/// sq-calibrate on stories260K, 8 windows × 64 tokens with Hessians, run in `cwd` with `-f text` as
/// given (possibly relative to `cwd`).
void calibrate_in(const std::string& cwd, const std::string& text, const std::string& out) {
  const ProcessResult r = test::run_process({test::tool("sq-calibrate"), "-m", test::stories_model(), "--tokenizer",
                                             test::stories_tokenizer(), "-f", text, "--samples", "8", "--seq-len", "64",
                                             "--hessian", "-o", out, "-q", "-t", "1"},
                                            300, cwd);
  ASSERT_EQ(r.exit_status, 0) << r.err;
}

/// sq-convert on stories260K (its tokenizer embedded) run in `cwd`: `recipe` with --calib `calib`,
/// `extra` flags, into `out`. One thread each: the tests run many small conversions, and the result
/// does not depend on the thread count.
ProcessResult convert_in(const std::string& cwd, const Recipe& recipe, const std::string& calib, const std::string& out,
                         const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {test::tool("sq-convert"), "-m", test::stories_model(), "--tokenizer", test::stories_tokenizer(),
                                   "--scheme", recipe.scheme, "--calib", calib, "-o", out, "-q", "-t", "1"};
  argv.insert(argv.end(), recipe.flags.begin(), recipe.flags.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return test::run_process(argv, 300, cwd);
}

std::string canonical(const std::string& p) { return fs::canonical(p).string(); }

nlohmann::json header_of(const std::string& sqm) { return SqmFile::open(sqm)->header(); }

/// Same tensors (names, dtypes, shapes, raw bytes) and the same header apart from the keys of its
/// calibration object listed in `ignored`.
void expect_same_model(const std::string& a, const std::string& b, const std::vector<std::string>& ignored) {
  const auto fa = SqmFile::open(a), fb = SqmFile::open(b);
  ASSERT_EQ(fa->names(), fb->names());
  for (const auto& name : fa->names()) {
    const SqmBytes ra = fa->raw(name), rb = fb->raw(name);
    ASSERT_EQ(ra.size, rb.size) << name;
    EXPECT_TRUE(ra.size == 0 || std::memcmp(ra.data, rb.data, ra.size) == 0) << name << " differs between " << a << " and " << b;
  }
  nlohmann::json ha = fa->header(), hb = fb->header();
  for (const auto& key : ignored) {
    ha.at("calibration").erase(key);
    hb.at("calibration").erase(key);
  }
  EXPECT_EQ(ha, hb);
}

/// A scratch directory with a private calibration text `story.txt` (the first 128 KiB of TinyStories
/// train) and its calibration `own.h5`, made by sq-calibrate run inside the directory with the
/// relative `-f story.txt`, as a user would.
class OwnText {
 public:
  OwnText() {
    test::write_file(text(), test::read_file(test::shared_data(kTrainText)).substr(0, 128 * 1024));
    calibrate_in(dir.path(), "story.txt", calib());
  }
  std::string text() const { return dir.file("story.txt"); }
  std::string calib() const { return dir.file("own.h5"); }
  /// A directory beside the text, created on first use.
  std::string sub(const std::string& name) const {
    fs::create_directories(dir.file(name));
    return dir.file(name);
  }
  ScratchDir dir;
};

// sq-calibrate run in the data directory with a relative -f (as `cd data && sq-calibrate -f
// tinystories/...`) records the text's absolute, canonical path.
TEST(CalibText, CalibrateRecordsTheAbsolutePathOfTheText) {
  ScratchDir dir;
  const std::string calib = dir.file("calib.h5");
  calibrate_in(SQ_SHARED_DATA_DIR, kTrainText, calib);
  if (::testing::Test::HasFatalFailure()) return;
  const CalibrationProvenance pv = read_calibration_h5(calib).provenance;
  EXPECT_EQ(pv.text_path, canonical(test::shared_data(kTrainText)));
  EXPECT_EQ(pv.text_sha256, sha256_file_hex(test::shared_data(kTrainText)));
}

// A calibration made with a relative -f inside the text's directory; sq-convert then runs from three
// working directories: that directory (where the relative path happens to work), a sibling directory
// and "/". Every run must give the same bytes, re-reading the same text (a 128 KiB TinyStories
// prefix rather than the 2 MiB file: nine conversions each read it twice).
TEST(CalibText, SameConvertCommandGivesTheSameBytesFromAnyWorkingDirectory) {
  OwnText own;
  if (::testing::Test::HasFatalFailure()) return;
  const std::string text = canonical(own.text());
  EXPECT_EQ(read_calibration_h5(own.calib()).provenance.text_path, text) << "sq-calibrate records the absolute, canonical path";

  const std::vector<std::string> cwds = {own.dir.path(), own.sub("elsewhere"), "/"};
  for (const Recipe& recipe : recipes()) {
    std::vector<std::string> outs;
    for (size_t i = 0; i < cwds.size(); ++i) {
      outs.push_back(own.dir.file(std::string(recipe.name) + "-" + std::to_string(i) + ".sqm"));
      const ProcessResult r = convert_in(cwds[i], recipe, own.calib(), outs.back());
      ASSERT_EQ(r.exit_status, 0) << recipe.name << " in " << cwds[i] << ": " << r.err;
    }
    const std::string first = test::read_file(outs[0]);
    for (size_t i = 1; i < outs.size(); ++i)
      EXPECT_TRUE(test::read_file(outs[i]) == first) << recipe.name << ": run in " << cwds[i] << " differs from the run in " << cwds[0];
    const nlohmann::json h = header_of(outs[0]);
    EXPECT_EQ(h.at("calibration").at("text"), text) << recipe.name;
    EXPECT_EQ(h.at("calibration").at("text_sha256"), sha256_file_hex(text)) << recipe.name;
    if (std::string(recipe.scheme) == "w4a16") {
      EXPECT_EQ(h.at("quantization").at("gptq").at("hessians"), "sequential");
    }
  }
}

// Another file under the recorded name (same path, other bytes) is refused by name, for every
// conversion that re-reads the text and also when given with --calib-text.
TEST(CalibText, DifferentTextUnderTheRecordedNameIsRefused) {
  OwnText own;
  if (::testing::Test::HasFatalFailure()) return;
  test::write_file(own.text(), test::read_file(own.text()) + "\nOne more story: the cat sat on the mat.\n");
  const std::string shown = canonical(own.text());
  // From the calibration's own directory (where even a relative record finds the new file) and "/".
  for (const std::string& cwd : {own.dir.path(), std::string("/")}) {
    for (const Recipe& recipe : recipes()) {
      const std::string out = own.dir.file(std::string(recipe.name) + ".sqm");
      const ProcessResult r = convert_in(cwd, recipe, own.calib(), out);
      test::expect_one_line_exit2(r, shown + ": SHA-256 ", out);
      EXPECT_NE(r.err.find("differs from the text_sha256"), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(own.calib()), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(read_calibration_h5(own.calib()).provenance.text_sha256.substr(0, 12)), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(sha256_file_hex(own.text()).substr(0, 12)), std::string::npos) << r.err;
    }
  }
  // --calib-text is checked as well.
  const std::string other = own.sub("other") + "/story.txt";
  test::write_file(other, test::read_file(test::shared_data(kTrainText)).substr(1000, 128 * 1024));
  const std::string out = own.dir.file("explicit.sqm");
  test::expect_one_line_exit2(convert_in(own.sub("other"), recipes()[0], own.calib(), out, {"--calib-text", "story.txt"}),
                              "story.txt: SHA-256 ", out);
}

// A missing text is an error that suggests --calib-text (no silent switch to the stored Hessians);
// --gptq-hessians file, which does not read the text, still works.
TEST(CalibText, MissingTextIsAnErrorNotAFallback) {
  OwnText own;
  if (::testing::Test::HasFatalFailure()) return;
  const std::string recorded = read_calibration_h5(own.calib()).provenance.text_path;
  fs::rename(own.text(), own.sub("moved") + "/story.txt");
  for (const Recipe& recipe : recipes()) {
    const std::string out = own.dir.file(std::string(recipe.name) + ".sqm");
    const ProcessResult r = convert_in("/", recipe, own.calib(), out);
    test::expect_one_line_exit2(r, ": its calibration text " + recorded + " is not found", out);
    EXPECT_NE(r.err.find("--calib-text FILE"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(own.calib() + ": its calibration text"), std::string::npos) << r.err;
  }
  const ProcessResult gptq = convert_in("/", recipes()[0], own.calib(), own.dir.file("gptq.sqm"));
  EXPECT_NE(gptq.err.find("--gptq-hessians file"), std::string::npos) << gptq.err;

  const std::string file_mode = own.dir.file("file-mode.sqm");
  const ProcessResult r = convert_in("/", recipes()[0], own.calib(), file_mode, {"--gptq-hessians", "file"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const nlohmann::json h = header_of(file_mode);
  EXPECT_EQ(h.at("quantization").at("gptq").at("hessians"), "file");
  EXPECT_EQ(h.at("calibration").at("text"), recorded) << "not re-read: the recorded text";
}

// --calib-text gives the text explicitly, relative to the working directory like any path: the result
// equals the conversion that found the text under its recorded path, and the header names the file
// actually read. The same command from another directory (absolute --calib-text) gives the same bytes.
TEST(CalibText, CalibTextWorksFromAnotherDirectory) {
  OwnText own;
  if (::testing::Test::HasFatalFailure()) return;
  for (const Recipe& recipe : recipes()) {
    const std::string before = own.dir.file(std::string(recipe.name) + "-recorded.sqm");
    ProcessResult r = convert_in("/", recipe, own.calib(), before);
    ASSERT_EQ(r.exit_status, 0) << recipe.name << ": " << r.err;
    EXPECT_EQ(header_of(before).at("calibration").at("text"), canonical(own.text()));
  }
  const std::string moved_dir = own.sub("moved");
  fs::rename(own.text(), moved_dir + "/story.txt");
  const std::string moved = canonical(moved_dir + "/story.txt");
  for (const Recipe& recipe : recipes()) {
    const std::string before = own.dir.file(std::string(recipe.name) + "-recorded.sqm");
    const std::string rel = own.dir.file(std::string(recipe.name) + "-rel.sqm"), abs = own.dir.file(std::string(recipe.name) + "-abs.sqm");
    ProcessResult r = convert_in(moved_dir, recipe, own.calib(), rel, {"--calib-text", "story.txt"});
    ASSERT_EQ(r.exit_status, 0) << recipe.name << ": " << r.err;
    r = convert_in("/", recipe, own.calib(), abs, {"--calib-text", moved});
    ASSERT_EQ(r.exit_status, 0) << recipe.name << ": " << r.err;
    EXPECT_TRUE(test::read_file(rel) == test::read_file(abs)) << recipe.name;
    const nlohmann::json h = header_of(rel);
    EXPECT_EQ(h.at("calibration").at("text"), moved) << recipe.name;
    EXPECT_EQ(h.at("calibration").at("text_sha256"), sha256_file_hex(moved)) << recipe.name;
    expect_same_model(before, rel, {"text"});
  }
}

// A calibration file from before sqkit recorded absolute paths (text_path relative, here rewritten
// so): the text is looked up beside the calibration file, then in the working directory.
TEST(CalibText, RelativeTextPathOfAnOlderCalibrationFile) {
  OwnText own;
  if (::testing::Test::HasFatalFailure()) return;
  CalibrationData d = read_calibration_h5(own.calib());
  d.provenance.text_path = "story.txt";
  const std::string old_beside = own.dir.file("old.h5");  // the text is beside it
  write_calibration_h5(old_beside, d);
  const std::string old_apart = own.sub("apart") + "/old.h5";  // the text is not beside it
  write_calibration_h5(old_apart, d);
  const Recipe& gptq = recipes()[0];

  const std::string ref = own.dir.file("ref.sqm");
  ProcessResult r = convert_in("/", gptq, own.calib(), ref);
  ASSERT_EQ(r.exit_status, 0) << r.err;

  const std::string beside = own.dir.file("beside.sqm");
  r = convert_in("/", gptq, old_beside, beside);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_EQ(header_of(beside).at("calibration").at("text"), canonical(own.text()));
  EXPECT_EQ(header_of(beside).at("quantization").at("gptq").at("hessians"), "sequential");
  expect_same_model(ref, beside, {"file_sha256"});

  const std::string in_cwd = own.dir.file("cwd.sqm");
  r = convert_in(own.dir.path(), gptq, old_apart, in_cwd);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_EQ(header_of(in_cwd).at("calibration").at("text"), canonical(own.text()));
  expect_same_model(ref, in_cwd, {"file_sha256"});

  const std::string nowhere = own.dir.file("nowhere.sqm");
  r = convert_in("/", gptq, old_apart, nowhere);
  test::expect_one_line_exit2(r, old_apart + ": its calibration text story.txt (a relative path) is not found beside it", nowhere);
  EXPECT_NE(r.err.find("--calib-text FILE"), std::string::npos) << r.err;
}

// --calib-text belongs to a calibration file and to a conversion that reads it.
TEST(CalibText, CalibTextNeedsCalibAndAUse) {
  OwnText own;
  if (::testing::Test::HasFatalFailure()) return;
  const std::string out = own.dir.file("x.sqm");
  ProcessResult r = test::run_process({test::tool("sq-convert"), "-m", test::stories_model(), "--scheme", "w4a16", "--calib-text",
                                       own.text(), "-o", out, "-q"});
  test::expect_one_line_exit2(r, "--calib-text needs --calib", out);
  r = convert_in("/", recipes()[0], own.calib(), out, {"--gptq-hessians", "file", "--calib-text", own.text()});
  test::expect_one_line_exit2(r, "--calib-text has no effect here", out);
  r = convert_in("/", {"x", "w8a8", {"--alpha", "0.5"}}, own.calib(), out, {"--calib-text", own.text()});
  test::expect_one_line_exit2(r, "--calib-text has no effect here", out);
  r = convert_in("/", recipes()[0], own.calib(), out, {"--calib-text", own.dir.file("missing.txt")});
  test::expect_one_line_exit2(r, "--calib-text " + own.dir.file("missing.txt") + ": no such file", out);
}

}  // namespace
}  // namespace sq
