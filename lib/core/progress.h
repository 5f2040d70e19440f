// Progress with rate and ETA on stderr: a bar redrawn in place on a terminal, a plain line every
// half minute otherwise (logs of runs under nohup or CI).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace sq {

/// A rate with as many digits as it needs: "0.42", "7.31", "23.4", "812", "12.3k" (below 10: two
/// decimals; below 100: one; below 10,000: none; then thousands with one decimal), so a rate that
/// is not zero never prints as "0" or "0.0k". "?" for a negative or non-finite rate.
std::string format_rate(double per_second);

/// On a terminal, prints "LABEL [#####.....] 40% 123/300 chunks, 45.1k tok/s, ETA 0:12" on stderr,
/// redrawn in place at most ~10 times per second. When stderr is not a terminal, prints the same
/// figures without the bar as one line ("LABEL 40% 123/300 chunks, 45.1k tok/s, ETA 0:12") at most
/// every `line_seconds` seconds (none before the first interval has passed, so short runs stay
/// silent; 0: at every update; negative: never). Silent when `enabled` is false or total <= 0.
/// Call update() from one thread only.
class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, std::string unit, bool enabled = true, double line_seconds = 30.0);
  ~ProgressBar();
  /// `done` items finished; `rate_items` (e.g. tokens) and its unit feed the rate display.
  void update(int64_t done, double rate_items = 0.0, const char* rate_unit = nullptr);
  /// Final redraw and newline.
  void finish();

 private:
  std::string label_, unit_;
  int64_t total_;
  bool enabled_, tty_, finished_ = false;
  double line_seconds_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace sq
