// Terminal progress bar with rate and ETA (stderr, only when stderr is a terminal).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace sq {

/// Prints "LABEL [#####.....] 40% 123/300 chunks, 45.1k tok/s, ETA 0:12" on stderr, redrawn in
/// place at most ~10 times per second. Silent when stderr is not a terminal or `enabled` is false.
/// Call update() from one thread only.
class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, std::string unit, bool enabled = true);
  ~ProgressBar();
  /// `done` items finished; `rate_items` (e.g. tokens) and its unit feed the rate display.
  void update(int64_t done, double rate_items = 0.0, const char* rate_unit = nullptr);
  /// Final redraw and newline.
  void finish();

 private:
  std::string label_, unit_;
  int64_t total_;
  bool enabled_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace sq
