#include "core/cpu_cores.h"

#include "core/cgroup.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

namespace sq {

namespace {

std::string read_first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  return line;
}

/// Whole-number text (no sign, no other characters) as a long long, or nothing.
std::optional<long long> positive_integer(const std::string& s) {
  if (s.empty() || s.size() > 18 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  const long long v = std::stoll(s);
  if (v <= 0) return std::nullopt;
  return v;
}

std::optional<int> cgroup_quota_cores() {
  // Our own cgroup and each parent up to the root: the tightest quota applies.
  std::optional<int> best;
  for (const std::string& dir : own_cgroup_v2_directories()) {
    const std::optional<int> c = cores_from_cpu_max(read_first_line(dir + "/cpu.max"));
    if (c && (!best || *c < *best)) best = c;
  }
  if (best) return best;
  // cgroup v1 (the mount's root, as seen from inside a container).
  const std::string quota = read_first_line("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
  const std::string period = read_first_line("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
  if (const auto q = positive_integer(quota), p = positive_integer(period); q && p)
    return std::max(1, static_cast<int>(std::ceil(double(*q) / double(*p))));
  return std::nullopt;
}

}  // namespace

std::optional<int> cores_from_cpu_max(const std::string& cpu_max_line) {
  std::istringstream in(cpu_max_line);
  std::string quota, period, rest;
  if (!(in >> quota >> period) || (in >> rest)) return std::nullopt;
  const auto p = positive_integer(period);
  if (!p || quota == "max") return std::nullopt;
  const auto q = positive_integer(quota);
  if (!q) return std::nullopt;
  return std::max(1, static_cast<int>(std::ceil(double(*q) / double(*p))));
}

int available_cores() {
  int cores = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);
  if (cores <= 0) cores = 1;
  if (const std::optional<int> quota = cgroup_quota_cores()) cores = std::min(cores, *quota);
  return std::max(cores, 1);
}

}  // namespace sq
