#include "core/memory_probe.h"

#include <cstdio>
#include <cstring>

namespace sq {

namespace {
/// The value in kB of field `key` (e.g. "RssAnon:") of /proc/self/status, in bytes; 0 when absent.
int64_t status_field_bytes(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long long kb = 0;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, n) == 0) {
      std::sscanf(line + n, "%lld", &kb);
      break;
    }
  std::fclose(f);
  return static_cast<int64_t>(kb) * 1024;
}
}  // namespace

int64_t current_rss_anon_bytes() { return status_field_bytes("RssAnon:"); }

int64_t peak_rss_bytes() { return status_field_bytes("VmHWM:"); }

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
