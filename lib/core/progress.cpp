#include "core/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace sq {

namespace {
std::string format_duration(double s) {
  if (!(s >= 0) || s > 360000) return "--:--";
  const int t = static_cast<int>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%d:%02d", t / 60, t % 60);
  return buf;
}
}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit, bool enabled, double line_seconds)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      tty_(isatty(2) != 0),
      line_seconds_(line_seconds) {
  enabled_ = enabled && total > 0 && (tty_ || line_seconds_ >= 0);  // off a terminal, a negative interval: no lines
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

std::string format_rate(double r) {
  char buf[32];
  if (!(r >= 0) || !std::isfinite(r)) return "?";
  if (r < 9.995) std::snprintf(buf, sizeof buf, "%.2f", r);
  else if (r < 99.95) std::snprintf(buf, sizeof buf, "%.1f", r);
  else if (r < 9999.5) std::snprintf(buf, sizeof buf, "%.0f", r);
  else std::snprintf(buf, sizeof buf, "%.1fk", r / 1000.0);
  return buf;
}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(int64_t done, double rate_items, const char* rate_unit) {
  if (!enabled_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (tty_) {
    if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  } else if (std::chrono::duration<double>(now - last_draw_).count() < line_seconds_ || (line_seconds_ > 0 && done >= total_)) {
    return;  // plain lines: one per interval, none for the end (the tool prints its result)
  }
  last_draw_ = now;
  const double frac = static_cast<double>(done) / static_cast<double>(total_);
  const double eta = done > 0 ? elapsed * (1.0 - frac) / frac : -1.0;
  char rate[64] = "";
  if (rate_unit && elapsed > 0) std::snprintf(rate, sizeof rate, ", %s %s/s", format_rate(rate_items / elapsed).c_str(), rate_unit);
  if (!tty_) {
    std::fprintf(stderr, "%s %d%% %lld/%lld %s%s, ETA %s\n", label_.c_str(), static_cast<int>(frac * 100),
                 static_cast<long long>(done), static_cast<long long>(total_), unit_.c_str(), rate, format_duration(eta).c_str());
    std::fflush(stderr);
    return;
  }
  const int width = 30, filled = static_cast<int>(frac * width);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(width - filled), '.');
  std::fprintf(stderr, "\r%s [%s] %3d%% %lld/%lld %s%s, ETA %s ", label_.c_str(), bar.c_str(), static_cast<int>(frac * 100),
               static_cast<long long>(done), static_cast<long long>(total_), unit_.c_str(), rate, format_duration(eta).c_str());
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  if (tty_) std::fprintf(stderr, "\n");
}

}  // namespace sq
