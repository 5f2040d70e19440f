#include "core/cgroup.h"

#include <fstream>

namespace sq {

std::vector<std::string> own_cgroup_v2_directories() {
  std::ifstream f("/proc/self/cgroup");
  std::string line, own;
  while (std::getline(f, line))
    if (line.rfind("0::", 0) == 0) own = line.substr(3);
  std::vector<std::string> dirs;
  if (own.empty()) return dirs;
  for (std::string dir = own;;) {
    dirs.push_back("/sys/fs/cgroup" + (dir == "/" ? std::string() : dir));
    if (dir == "/" || dir.empty()) break;
    const size_t slash = dir.find_last_of('/');
    dir = slash == 0 ? "/" : dir.substr(0, slash);
  }
  return dirs;
}

}  // namespace sq
