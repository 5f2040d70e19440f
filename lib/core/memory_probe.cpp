#include "core/memory_probe.h"

#include <cstdio>
#include <cstring>

namespace sq {

int64_t current_rss_anon_bytes() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "RssAnon:", 8) == 0) {
      std::sscanf(line + 8, "%lld", &kb);
      break;
    }
  std::fclose(f);
  return static_cast<int64_t>(kb) * 1024;
}

PeakRssAnonSampler::PeakRssAnonSampler(std::chrono::milliseconds period) {
  peak_ = current_rss_anon_bytes();
  thread_ = std::thread([this, period] {
    while (running_.load()) {
      const int64_t now = current_rss_anon_bytes();
      int64_t prev = peak_.load();
      while (now > prev && !peak_.compare_exchange_weak(prev, now)) {
      }
      std::this_thread::sleep_for(period);
    }
  });
}

PeakRssAnonSampler::~PeakRssAnonSampler() { stop(); }

void PeakRssAnonSampler::stop() {
  if (running_.exchange(false) && thread_.joinable()) thread_.join();
}

}  // namespace sq
