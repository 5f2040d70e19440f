// GoogleTest fixture of the CLI tests of one `sq-convert --scheme` on stories260K (W4A16Cli,
// AtomCli): one calibration per test suite in a scratch directory and the conversion, perplexity and
// bad-input helpers bound to the scheme.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/cli.h"
#include "tests/support/process.h"

namespace sq::test {

/// `Scheme` is the sq-convert --scheme value (a character array with static storage, e.g.
/// `constexpr char kScheme[] = "w4a16";`); each instantiation is its own test suite with its own
/// scratch directory and calibration.
template <const char* Scheme>
class SchemeCliTest : public ::testing::Test {
 protected:
  // 32 windows × 256 tokens with Hessians (a quarter of the benchmark tables' calibration).
  static void SetUpTestSuite() {
    dir_ = new ScratchDir();
    calibrate_stories(calib(), 32, 256, {"--hessian"});
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string calib() { return dir_->file("calib.h5"); }
  /// sq-convert --scheme Scheme with `extra` flags into `out`.
  static ProcessResult convert(std::vector<std::string> extra, const std::string& out) { return convert_stories(Scheme, extra, out); }
  /// Windows-protocol PPL at -c 256 over the first 40 windows of tinystories-valid-1000.
  /// The JSON report is replaced: several tests of a suite evaluate the same model (sq-eval refuses
  /// an existing --json file without --force).
  static double ppl(const std::string& model) {
    const std::string json = dir_->file(std::filesystem::path(model).filename().string() + ".ppl.json");
    std::filesystem::remove(json);
    return stories_ppl(model, json);
  }
  static void expect_error(const ProcessResult& r, const std::string& expected, const std::string& out_path) {
    expect_one_line_exit2(r, expected, out_path);
  }
  inline static ScratchDir* dir_ = nullptr;
};

}  // namespace sq::test
