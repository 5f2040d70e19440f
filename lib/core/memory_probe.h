// Peak anonymous resident memory (RssAnon) of this process, sampled in the background.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace sq {

/// Current RssAnon of this process in bytes (from /proc/self/status; 0 when unavailable).
/// RssAnon counts private anonymous pages (heap, stacks) but not file-backed pages such as a
/// memory-mapped checkpoint.
int64_t current_rss_anon_bytes();

/// Peak resident set size of this process so far in bytes (VmHWM of /proc/self/status: anonymous
/// and file-backed pages, mapped model files included, as `time -v` reports it); 0 when unavailable.
int64_t peak_rss_bytes();

/// Samples RssAnon every `period` on a background thread from construction until stop() or
/// destruction and keeps the maximum. Linux keeps no RssAnon high-water mark, so this is a sampled
/// peak: allocations that live shorter than `period` can be missed.
class PeakRssAnonSampler {
 public:
  explicit PeakRssAnonSampler(std::chrono::milliseconds period = std::chrono::milliseconds(2));
  ~PeakRssAnonSampler();
  PeakRssAnonSampler(const PeakRssAnonSampler&) = delete;
  PeakRssAnonSampler& operator=(const PeakRssAnonSampler&) = delete;
  void stop();
  int64_t peak_bytes() const { return peak_.load(); }

 private:
  std::atomic<bool> running_{true};
  std::atomic<int64_t> peak_{0};
  std::thread thread_;
};

}  // namespace sq
