// Shared-memory names in tests: unique prefixes for the segments a test
// makes, and the /dev/shm entries under a prefix (the tests' check that
// nothing is left behind).
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace hvdtorch::test {

// The prefix of every name this test process makes: "/hvdtest-<pid>-".
inline std::string testShmPrefix() { return "/hvdtest-" + std::to_string(getpid()) + "-"; }

// A prefix no other run of this process or any other process uses:
// "/hvdtest-<pid>-<what><n>". Main thread only.
inline std::string uniqueShmPrefix(const std::string& what) {
  static int n = 0;
  return testShmPrefix() + what + std::to_string(n++);
}

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
