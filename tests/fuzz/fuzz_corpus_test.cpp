// Runs every fuzz entry point (tests/fuzz/fuzz_targets.h) over its seed corpus — generated seeds,
// the real files of the shared data directory (read in place), and the crash regressions in
// tests/fuzz/regressions/<target>/ — plus deterministic truncations and byte flips of each seed, so
// that CI re-checks what the libFuzzer runs found without needing clang. An entry point returns
// normally for every input it handles properly; anything escaping is a failure here.
#include <gtest/gtest.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "formats/mapped_file.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/support/test_data.h"

namespace {

namespace fs = std::filesystem;
using sq::fuzz::FuzzTarget;

/// Runs `target` on `input`, recording a failure (with `what`) when anything escapes.
void run_checked(const FuzzTarget& target, const std::string& input, const std::string& what) {
  try {
    sq::fuzz::run_on(target, input);
  } catch (const std::exception& e) {
    ADD_FAILURE() << target.name << " on " << what << " (" << input.size() << " bytes): " << e.what();
  }
}

/// The input itself, 16 truncations and 32 single-byte flips (positions spread over the input).
void run_with_mutations(const FuzzTarget& target, const std::string& input, const std::string& what) {
  run_checked(target, input, what);
  if (input.empty()) return;
  for (size_t k = 0; k < 16; ++k) {
    const size_t len = input.size() * k / 16;
    run_checked(target, input.substr(0, len), what + " cut to " + std::to_string(len));
  }
  for (uint64_t k = 0; k < 32; ++k) {
    std::string flipped = input;
    const size_t pos = static_cast<size_t>((k * 2654435761u + 7) % input.size());
    flipped[pos] = static_cast<char>(flipped[pos] ^ (k % 2 ? 0xff : 0x01));
    run_checked(target, flipped, what + " flipped at " + std::to_string(pos));
  }
}

class FuzzCorpus : public ::testing::TestWithParam<size_t> {};

TEST_P(FuzzCorpus, SeedsMutationsAndRegressionsAreHandled) {
  const FuzzTarget& t = sq::fuzz::fuzz_targets()[GetParam()];
  const auto seeds = t.generated_seeds();
  ASSERT_FALSE(seeds.empty()) << t.name;
  for (size_t i = 0; i < seeds.size(); ++i) run_with_mutations(t, seeds[i], "generated seed " + std::to_string(i));
  for (const std::string& rel : t.shared_seed_files) {
    const std::string path = sq::test::shared_data(rel);
    if (!fs::is_regular_file(path)) continue;  // the shared data is optional for this test
    run_with_mutations(t, sq::read_file_to_string(path), path);
  }
  const fs::path regressions = fs::path(SQ_FUZZ_REGRESSIONS_DIR) / t.name;
  if (fs::is_directory(regressions)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(regressions))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) run_checked(t, sq::read_file_to_string(f.string()), f.string());
  }
}

INSTANTIATE_TEST_SUITE_P(AllTargets, FuzzCorpus, ::testing::Range(size_t(0), sq::fuzz::fuzz_targets().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return std::string(sq::fuzz::fuzz_targets()[info.param].name);
                         });

TEST(FuzzCorpus, EveryTargetHasAFuzzerSource) {
  for (const FuzzTarget& t : sq::fuzz::fuzz_targets())
    EXPECT_TRUE(fs::is_regular_file(fs::path(SQ_FUZZ_REGRESSIONS_DIR).parent_path() / (std::string(t.name) + "_fuzz.cpp")))
        << t.name;
}

}  // namespace
