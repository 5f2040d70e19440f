// The OpenMP team size under CPU contention (issue 38; design and measurements: docs/threading.md).
//
// Every parallel region ends at a barrier, and a decode step has a few regions per layer. When
// another process shares the cores, one of the team's threads is regularly descheduled for a whole
// scheduler time slice (milliseconds) while the others wait at the barrier: two threads then run
// 2-20x slower than one. The governor watches how long this process's threads wait for a CPU
// (the kernel's per-thread run delay, /proc/self/task/*/schedstat field 2, in ns) over short
// samples and sets the team size of the following regions (omp_set_num_threads):
//   - a sample in which on average more than `contended_threads` of our threads were runnable but
//     not running shrinks the team (by the rounded number of waiting threads, at least 1);
//   - below the maximum (the -t value), a probe adds one thread after `probe_first_seconds`; if the
//     probe's sample is contended the thread goes again and the next probe waits twice as long (up
//     to `probe_max_seconds`); an uncontended probe keeps the thread and resets the wait;
//   - the first sample starts at the first work boundary (not at govern(), so model loading does
//     not count) and, like a probe's, is short (`short_sample_seconds`).
// Results do not change with the team size: the kernels give the same bits for any thread count
// (ops::sgemm outside parallel regions included; tests: MoreThreadsThanCores.*, Sgemm.*,
// LinearSgemm.*, *DoesNotDependOnThe*). Choices of how to split work use max_threads().
#pragma once

#include <cstdint>
#include <optional>

namespace sq::threads {

/// Tunables of the governor. Times in seconds of wall-clock (steady) time.
struct GovernorPolicy {
  double sample_seconds = 0.05;       ///< length of one measurement (one decision per sample)
  /// Length of the first sample and of a probe's: a team too large for the CPUs the process gets
  /// runs 2–10× slower while it lasts, and the signal is then unambiguous (0.9–1.0 threads waiting).
  double short_sample_seconds = 0.02;
  double contended_threads = 0.4;     ///< mean threads waiting for a CPU above which a sample counts as contended
  double probe_first_seconds = 0.5;   ///< time after a change before the first probe of one more thread
  double probe_max_seconds = 4.0;     ///< longest wait between probes (doubled after each failed probe)
};

/// The decision rule alone (no clocks, no /proc), so that it can be tested with made-up samples.
class Governor {
 public:
  /// Starts at `max_threads` (≥ 1; smaller values count as 1).
  explicit Governor(int max_threads, GovernorPolicy policy = {});
  /// One finished sample: `now` (seconds, non-decreasing) and `waiting`, the mean number of this
  /// process's threads that were runnable but waiting for a CPU during it (Σ run-delay ÷ sample
  /// length; ≥ 0). Returns the team size for the next sample (1 … max).
  int on_sample(double now, double waiting);
  int team() const { return team_; }
  int max_threads() const { return max_; }
  /// True while the current team is a probe (one thread more than the last settled size).
  bool probing() const { return probing_; }
  /// Length of the sample now running: short_sample_seconds for the first sample and a probe's,
  /// else sample_seconds.
  double sample_length() const { return probing_ || !started_ ? policy_.short_sample_seconds : policy_.sample_seconds; }
  const GovernorPolicy& policy() const { return policy_; }

 private:
  GovernorPolicy policy_;
  int max_ = 1, team_ = 1;
  bool probing_ = false;
  bool started_ = false;
  double last_change_ = 0.0, probe_wait_ = 0.0;
};

/// Σ over this process's threads of the time they spent runnable but waiting for a CPU, in ns
/// (field 2 of /proc/self/task/TID/schedstat). Nothing when the kernel does not provide it.
std::optional<uint64_t> process_run_delay_ns();

/// Turns the process-wide governor on with `max_threads` (the tools' -t value or the default) unless
/// the environment has SQ_ADAPTIVE_THREADS=0, max_threads is 1 or the kernel has no schedstat; sets
/// omp_set_num_threads(max_threads) either way. The calling thread becomes the governing thread.
/// Libraries and tests that never call it keep the fixed OpenMP thread count.
void govern(int max_threads);

/// Called at work boundaries (a decoder layer, a GEMM): when governing, on the governing thread,
/// outside any parallel region, and a sample is due, reads the run delay and applies the
/// governor's team size with omp_set_num_threads. Otherwise returns at once (a clock read).
void adapt();

/// The most threads this process may use: the governor's maximum (the tools' -t) when governing,
/// else omp_get_max_threads(). For choices that must not depend on the load at one instant (how an
/// evaluation splits its work, per-thread memory estimates, the thread count a report prints);
/// regions still get the current team.
int max_threads();

}  // namespace sq::threads
