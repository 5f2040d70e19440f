// sq-fuzz-seeds OUT_DIR [SHARED_DATA_DIR]: writes the seed corpus of every fuzz target
// (tests/fuzz/fuzz_targets.h) to OUT_DIR/<target>/: the generated seeds as gen-<i>, and symbolic
// links to the target's real files in SHARED_DATA_DIR (used in place, never copied). Used by
// scripts/fuzz.sh; exit status 0 on success, 1 on failure.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/fuzz/fuzz_targets.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s OUT_DIR [SHARED_DATA_DIR]\n", argv[0]);
    return 1;
  }
  namespace fs = std::filesystem;
  try {
    for (const sq::fuzz::FuzzTarget& t : sq::fuzz::fuzz_targets()) {
      const fs::path dir = fs::path(argv[1]) / t.name;
      fs::create_directories(dir);
      const auto seeds = t.generated_seeds();
      for (size_t i = 0; i < seeds.size(); ++i) {
        std::ofstream out(dir / ("gen-" + std::to_string(i)), std::ios::binary | std::ios::trunc);
        out.write(seeds[i].data(), static_cast<std::streamsize>(seeds[i].size()));
        if (!out) throw std::runtime_error("cannot write " + (dir / ("gen-" + std::to_string(i))).string());
      }
      size_t linked = 0;
      for (const std::string& rel : t.shared_seed_files) {
        if (argc < 3) break;
        const fs::path src = fs::absolute(fs::path(argv[2]) / rel);
        if (!fs::is_regular_file(src)) continue;
        const fs::path link = dir / ("shared-" + src.filename().string());
        std::error_code ec;
        fs::remove(link, ec);
        fs::create_symlink(src, link);
        ++linked;
      }
      std::printf("%s: %zu generated seeds, %zu shared files\n", t.name, seeds.size(), linked);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sq-fuzz-seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
