// How much memory this process may still use, and the refusal of work whose estimated peak does
// not fit (issue 39 point 2: a tool killed by the kernel after minutes of work says nothing).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace sq {

/// The work asked for needs more memory than this process may use (exit status 2, as bad input:
/// the user must ask for less, stream the model, or move to a larger machine). The message names
/// the estimate, its parts and the limit that applies.
class MemoryLimitError : public UsageError {
 public:
  using UsageError::UsageError;
};

/// The memory this process may still use, in bytes, and where the bound comes from.
struct MemoryBudget {
  /// Resident memory still available: min(MemAvailable of /proc/meminfo, cgroup memory.max −
  /// memory.current of the process's own cgroup v2 or v1), −1 when unknown.
  int64_t resident = -1;
  std::string resident_source;  ///< "MemAvailable" or "cgroup memory.max"
  /// Address space still available: RLIMIT_AS − this process's VmSize (prlimit --as, ulimit -v),
  /// −1 when unlimited. Mapped model files count here, not in `resident`.
  int64_t address_space = -1;
};

/// Reads the budget now (/proc/meminfo, /proc/self/status, /sys/fs/cgroup, getrlimit). Never throws.
MemoryBudget current_memory_budget();

/// A peak-memory estimate made before the work, as named parts in bytes.
struct MemoryEstimate {
  std::vector<std::pair<std::string, int64_t>> resident;  ///< anonymous memory: weights, copies, buffers
  int64_t mapped = 0;  ///< file bytes mapped (count against RLIMIT_AS, not against resident memory)
  void add(const std::string& what, int64_t bytes) { resident.emplace_back(what, bytes); }
  int64_t resident_total() const;
  /// "3.1 GB (FP32 weights 2.0 GB + packed linears 1.1 GB)".
  std::string describe() const;
};

/// Throws MemoryLimitError when `e` does not fit `budget`: resident_total() > budget.resident, or
/// resident_total() + mapped > budget.address_space. The message starts with `what` (e.g. "sq-eval
/// of MODEL") and names the estimate with its parts, the memory available and its source, and
/// `hint` (what to do instead) when not empty.
void check_memory_fits(const MemoryEstimate& e, const MemoryBudget& budget, const std::string& what, const std::string& hint = "");

}  // namespace sq
