// A .sqm converted without a tokenizer (issue 14, point 8): sq-convert warns once on stderr, and
// loading it without --tokenizer names the real cause (exit 2) instead of "cannot open
// model.sqm (embedded tokenizer)".
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "formats/tokenizer.h"
#include "model/model_loader.h"
#include "tests/support/cli.h"
#include "tests/support/expect_error.h"
#include "tests/support/process.h"
#include "tests/support/test_data.h"

namespace sq::test {
namespace {

/// sq-convert of stories260K (a llama2.c file: no tokenizer beside it) without --tokenizer.
ProcessResult convert_without_tokenizer(const std::string& out) {
  return run_process({tool("sq-convert"), "-m", stories_model(), "--scheme", "f32", "-o", out, "-q"});
}

TEST(SqmWithoutTokenizer, ConversionWarnsOnceOnStderr) {
  ScratchDir dir;
  const std::string out = dir.file("model.sqm");
  const ProcessResult r = convert_without_tokenizer(out);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(out));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("sq-convert: warning: " + out + " has no embedded tokenizer", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("no tokenizer given with --tokenizer or found beside " + stories_model() + "); tools will need --tokenizer"),
            std::string::npos)
      << r.err;
  // With a tokenizer: no warning.
  const ProcessResult with = convert_stories("f32", {}, dir.file("with.sqm"));
  ASSERT_EQ(with.exit_status, 0) << with.err;
  EXPECT_EQ(with.err, "");
}

TEST(SqmWithoutTokenizer, FailedConversionPrintsOnlyItsError) {
  // The warning comes after a successful write: a conversion that fails prints one line.
  ScratchDir dir;
  const std::string out = dir.file("model.sqm");
  const ProcessResult r = run_process({tool("sq-convert"), "-m", stories_model(), "--scheme", "w8a8", "--preset", "O3",
                                       "--no-smooth", "-o", out, "-q"});
  EXPECT_EQ(r.exit_status, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
}

TEST(SqmWithoutTokenizer, LoadingNamesTheMissingEmbeddedTokenizer) {
  ScratchDir dir;
  const std::string sqm = dir.file("model.sqm");
  ASSERT_EQ(convert_without_tokenizer(sqm).exit_status, 0);
  const LoadedModel m = load_model(sqm);
  expect_error<InputError>([&] { open_tokenizer_for(m, ""); },
                           {sqm + " has no embedded tokenizer (converted without one); give --tokenizer FILE"});
  // An explicit tokenizer works.
  EXPECT_EQ(open_tokenizer_for(m, stories_tokenizer())->vocab_size(), 512);
}

TEST(SqmWithoutTokenizer, ToolsExit2WithTheCauseAndWorkWithTokenizer) {
  ScratchDir dir;
  const std::string sqm = dir.file("model.sqm"), json = dir.file("eval.json");
  ASSERT_EQ(convert_without_tokenizer(sqm).exit_status, 0);
  const std::string cause = sqm + " has no embedded tokenizer (converted without one); give --tokenizer FILE";
  expect_one_line_exit2(run_process({tool("sq-eval"), "-m", sqm, "-f", tinystories_valid(), "-c", "64", "--chunks", "2", "-q",
                                     "--json", json}),
                        "sq-eval: error: " + cause, json);
  expect_one_line_exit2(run_process({tool("sq-run"), "-m", sqm, "-p", "Once upon a time", "-n", "4", "-q"}),
                        "sq-run: error: " + cause);
  const ProcessResult ok = run_process({tool("sq-eval"), "-m", sqm, "--tokenizer", stories_tokenizer(), "-f", tinystories_valid(),
                                        "-c", "64", "--chunks", "2", "-q"});
  EXPECT_EQ(ok.exit_status, 0) << ok.err;
}

}  // namespace
}  // namespace sq::test
