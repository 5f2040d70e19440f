#include "runtime/thread_governor.h"

#include <dirent.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace sq::threads {

Governor::Governor(int max_threads, GovernorPolicy policy) : policy_(policy), max_(std::max(1, max_threads)), team_(max_) {
  probe_wait_ = policy_.probe_first_seconds;
}

int Governor::on_sample(double now, double waiting) {
  if (!started_) {  // the first sample's time is where probe waits count from
    started_ = true;
    last_change_ = now;
  }
  const bool contended = waiting > policy_.contended_threads;
  if (probing_) {
    probing_ = false;
    last_change_ = now;
    if (contended) {  // the extra thread made things wait: drop it, probe less often
      team_ = std::max(1, team_ - 1);
      probe_wait_ = std::min(2.0 * probe_wait_, policy_.probe_max_seconds);
    } else {
      probe_wait_ = policy_.probe_first_seconds;
    }
  } else if (contended && team_ > 1) {
    const int drop = std::max(1, static_cast<int>(std::lround(waiting)));
    team_ = std::max(1, team_ - drop);
    last_change_ = now;
  } else if (!contended && team_ < max_ && now - last_change_ >= probe_wait_) {
    ++team_;
    probing_ = true;
    last_change_ = now;
  }
  return team_;
}

std::optional<uint64_t> process_run_delay_ns() {
  DIR* dir = ::opendir("/proc/self/task");
  if (!dir) return std::nullopt;
  uint64_t total = 0;
  bool any = false;
  char path[300], buf[128];  // "/proc/self/task/" + a 255-byte name at most
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::snprintf(path, sizeof path, "/proc/self/task/%s/schedstat", e->d_name);
    std::FILE* f = std::fopen(path, "r");
    if (!f) continue;  // the thread exited meanwhile
    const size_t got = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[got] = '\0';
    unsigned long long run = 0, delay = 0;
    if (std::sscanf(buf, "%llu %llu", &run, &delay) == 2) {
      total += delay;
      any = true;
    }
  }
  ::closedir(dir);
  if (!any) return std::nullopt;
  return total;
}

namespace {

using Clock = std::chrono::steady_clock;

/// The process-wide state. Only the governing thread reads or writes it after govern().
struct ProcessGovernor {
  std::atomic<bool> on{false};
  std::thread::id owner;
  Governor governor{1};
  Clock::time_point epoch, sample_start;
  uint64_t delay_at_start = 0;
  bool primed = false;  // the first sample has started (at the first work boundary after govern())
  int max_threads = 1;
  bool trace = false;  // SQ_GOVERNOR_TRACE=1: one stderr line per change of the team
};

ProcessGovernor& state() {
  static ProcessGovernor s;
  return s;
}

double seconds_since(Clock::time_point t0, Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); }

}  // namespace

void govern(int max_threads) {
  ProcessGovernor& s = state();
  s.max_threads = std::max(1, max_threads);
  omp_set_num_threads(s.max_threads);
  // On unless SQ_ADAPTIVE_THREADS=0 (docs/threading.md, "Status").
  const char* env = std::getenv("SQ_ADAPTIVE_THREADS");
  const bool disabled = env && std::strcmp(env, "0") == 0;
  const std::optional<uint64_t> delay = process_run_delay_ns();
  if (disabled || !delay || s.max_threads == 1) {
    s.on = false;
    return;
  }
  s.governor = Governor(s.max_threads);
  s.owner = std::this_thread::get_id();
  s.epoch = s.sample_start = Clock::now();
  s.delay_at_start = *delay;
  s.primed = false;
  const char* trace = std::getenv("SQ_GOVERNOR_TRACE");
  s.trace = trace && std::strcmp(trace, "1") == 0;
  s.on = true;
}

void adapt() {
  ProcessGovernor& s = state();
  if (!s.on.load(std::memory_order_relaxed) || omp_get_level() != 0 || std::this_thread::get_id() != s.owner) return;
  const Clock::time_point now = Clock::now();
  const double length = seconds_since(s.sample_start, now);
  if (s.primed && length < s.governor.sample_length()) return;
  const std::optional<uint64_t> delay = process_run_delay_ns();
  if (!delay) return;
  if (!s.primed) {  // the first work boundary: the first sample starts here, after loading
    s.primed = true;
    s.sample_start = now;
    s.delay_at_start = *delay;
    return;
  }
  if (*delay < s.delay_at_start) {  // a thread exited and took its run delay with it: no decision
    s.sample_start = now;
    s.delay_at_start = *delay;
    return;
  }
  const double waiting = double(*delay - s.delay_at_start) * 1e-9 / length;
  const int before = s.governor.team();
  const int team = s.governor.on_sample(seconds_since(s.epoch, now), waiting);
  if (team != before) omp_set_num_threads(team);
  if (s.trace && (team != before || s.governor.probing()))
    std::fprintf(stderr, "thread governor: t=%.3f s sample %.1f ms, %.3f threads waiting: team %d -> %d%s\n",
                 seconds_since(s.epoch, now), length * 1e3, waiting, before, team, s.governor.probing() ? " (probe)" : "");
  s.sample_start = now;
  s.delay_at_start = *delay;
}

int max_threads() {
  const ProcessGovernor& s = state();
  return s.on ? s.max_threads : omp_get_max_threads();
}

}  // namespace sq::threads
