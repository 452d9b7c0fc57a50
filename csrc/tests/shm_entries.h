// Lists /dev/shm entries by name prefix: the tests' check that nothing is
// left behind.
#pragma once

#include <dirent.h>

#include <string>
#include <vector>

namespace hvdtorch::test {

// Entries of /dev/shm whose name starts with `prefix` (given with its '/').
inline std::vector<std::string> shmEntries(const std::string& prefix) {
  std::vector<std::string> found;
  DIR* d = opendir("/dev/shm");
  if (!d) return found;
  while (dirent* e = readdir(d)) {
    const std::string name = std::string("/") + e->d_name;
    if (name.compare(0, prefix.size(), prefix) == 0) found.push_back(name);
  }
  closedir(d);
  return found;
}

}  // namespace hvdtorch::test
