#include "core/memory_budget.h"

#include "core/cgroup.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace sq {

namespace {

/// "KEY:   N kB" of a /proc file, in bytes, or −1.
int64_t proc_kib_field(const char* path, const std::string& key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (line.compare(0, key.size() + 1, key + ":") == 0) {
      std::istringstream in(line.substr(key.size() + 1));
      long long kib = -1;
      if (in >> kib && kib >= 0) return int64_t(kib) * 1024;
      return -1;
    }
  return -1;
}

/// A file holding one unsigned integer (cgroup files), or −1 ("max", missing, malformed).
int64_t read_integer_file(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }) || s.size() > 18)
    return -1;
  return std::stoll(s);
}

/// The tightest cgroup memory limit minus usage of this process's cgroup (v2: its path and its
/// parents; v1: the memory controller's mount), or −1.
int64_t cgroup_memory_left() {
  int64_t best = -1;
  for (const std::string& base : own_cgroup_v2_directories()) {
    const int64_t max = read_integer_file(base + "/memory.max"), cur = read_integer_file(base + "/memory.current");
    if (max >= 0 && cur >= 0) {
      const int64_t left = std::max<int64_t>(0, max - cur);
      if (best < 0 || left < best) best = left;
    }
  }
  if (best >= 0) return best;
  const int64_t max = read_integer_file("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  const int64_t cur = read_integer_file("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  if (max >= 0 && cur >= 0 && max < (int64_t(1) << 60)) return std::max<int64_t>(0, max - cur);
  return -1;
}

std::string gb(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, bytes >= 100'000'000 ? "%.1f GB" : "%.0f MB", bytes >= 100'000'000 ? bytes / 1e9 : bytes / 1e6);
  return buf;
}

}  // namespace

MemoryBudget current_memory_budget() {
  MemoryBudget b;
  const int64_t avail = proc_kib_field("/proc/meminfo", "MemAvailable");
  if (avail >= 0) {
    b.resident = avail;
    b.resident_source = "MemAvailable";
  }
  const int64_t cg = cgroup_memory_left();
  if (cg >= 0 && (b.resident < 0 || cg < b.resident)) {
    b.resident = cg;
    b.resident_source = "cgroup memory.max";
  }
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    const int64_t used = std::max<int64_t>(0, proc_kib_field("/proc/self/status", "VmSize"));
    b.address_space = std::max<int64_t>(0, int64_t(rl.rlim_cur) - used);
  }
  return b;
}

int64_t MemoryEstimate::resident_total() const {
  int64_t t = 0;
  for (const auto& [what, bytes] : resident) t += bytes;
  return t;
}

std::string MemoryEstimate::describe() const {
  std::string s = gb(resident_total()) + " (";
  bool first = true;
  for (const auto& [what, bytes] : resident) {
    if (bytes <= 0) continue;
    s += (first ? "" : " + ") + what + " " + gb(bytes);
    first = false;
  }
  if (mapped > 0) s += std::string(first ? "" : "; ") + "plus " + gb(mapped) + " of mapped files";
  return s + ")";
}

void check_memory_fits(const MemoryEstimate& e, const MemoryBudget& budget, const std::string& what, const std::string& hint) {
  const int64_t need = e.resident_total();
  std::string limit;
  if (budget.resident >= 0 && need > budget.resident) {
    limit = gb(budget.resident) + " available (" + budget.resident_source + ")";
  } else if (budget.address_space >= 0 && need + e.mapped > budget.address_space) {
    limit = gb(budget.address_space) + " of address space left under this process's limit (RLIMIT_AS: ulimit -v / prlimit --as)";
  } else {
    return;
  }
  throw MemoryLimitError(what + " needs about " + e.describe() + " but only " + limit + "; nothing was done" +
                         (hint.empty() ? "" : ": " + hint));
}

}  // namespace sq
