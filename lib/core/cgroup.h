// The cgroup (v2) directories that bound this process: its own and each parent up to the root.
#pragma once

#include <string>
#include <vector>

namespace sq {

/// "/sys/fs/cgroup/PATH" of this process's cgroup v2 ("0::/PATH" in /proc/self/cgroup), then of each
/// parent up to "/sys/fs/cgroup" itself, in that order; empty without a cgroup v2 entry. A limit
/// set on any of them applies, so callers take the tightest. Never throws.
std::vector<std::string> own_cgroup_v2_directories();

}  // namespace sq
