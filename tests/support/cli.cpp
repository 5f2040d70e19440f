#include "tests/support/cli.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/support/test_data.h"

namespace sq::test {

void calibrate_stories(const std::string& out, int samples, int seq_len, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {tool("sq-calibrate"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-f",
                                   shared_data("tinystories/tinystories-train-2MiB.txt"), "--samples", std::to_string(samples),
                                   "--seq-len", std::to_string(seq_len), "-o", out, "-q"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const ProcessResult r = run_process(argv);
  ASSERT_EQ(r.exit_status, 0) << r.err;
}

ProcessResult convert_stories(const std::string& scheme, const std::vector<std::string>& extra, const std::string& out) {
  std::vector<std::string> argv = {tool("sq-convert"), "-m", stories_model(), "--tokenizer", stories_tokenizer(),
                                   "--scheme", scheme, "-o", out, "-q"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run_process(argv);
}

double stories_ppl(const std::string& model, const std::string& json, int chunks) {
  const ProcessResult r = run_process({tool("sq-eval"), "-m", model, "--tokenizer", stories_tokenizer(), "-f", tinystories_valid(),
                                       "-c", "256", "--chunks", std::to_string(chunks), "-q", "--json", json});
  EXPECT_EQ(r.exit_status, 0) << r.err;
  if (r.exit_status != 0) return 0.0;
  return nlohmann::json::parse(read_file(json)).at("ppl").get<double>();
}

void expect_one_line_exit2(const ProcessResult& r, const std::string& expected, const std::string& out_path) {
  EXPECT_EQ(r.exit_status, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(expected), std::string::npos) << "stderr: " << r.err << "expected: " << expected;
  if (!out_path.empty()) {
    EXPECT_FALSE(std::filesystem::exists(out_path)) << out_path;
  }
}

}  // namespace sq::test
