// How many CPU cores this process may use: its affinity mask and its cgroup's CPU quota. The
// tools' default thread count (-t 0) is this number, never more (issue 38).
#pragma once

#include <optional>
#include <string>

namespace sq {

/// Cores this process may run on: min(CPUs in its affinity mask (sched_getaffinity), ⌈cgroup CPU
/// quota⌉). The quota is read from cgroup v2 `cpu.max` ("QUOTA PERIOD" or "max PERIOD") of the
/// process's own cgroup (/proc/self/cgroup, under /sys/fs/cgroup), else cgroup v1
/// `cpu.cfs_quota_us` / `cpu.cfs_period_us`; a missing or unlimited quota does not bound it.
/// At least 1; never throws.
int available_cores();

/// The cores a cgroup v2 `cpu.max` line allows: ⌈quota / period⌉ (at least 1), or nothing for
/// "max ..." (unlimited) and for text that is not two positive integers (or "max" and one).
std::optional<int> cores_from_cpu_max(const std::string& cpu_max_line);

}  // namespace sq
