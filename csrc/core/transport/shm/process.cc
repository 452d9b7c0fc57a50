#include "transport/shm/process.h"

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace hvdtorch {

namespace {

struct ProcStat {
  bool ok = false;
  char state = '?';
  uint64_t start_time = 0;
};

// Parses /proc/<pid>/stat: "pid (comm) S ppid ... starttime ...". The command
// name may contain spaces and parentheses, so fields are counted from the
// last ')'. Field 3 is the state, field 22 the start time.
ProcStat readProcStat(pid_t pid) {
  ProcStat st;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return st;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  if (!p || p[1] != ' ') return st;
  p += 2;
  st.state = *p;
  // Skip fields 3..21 (19 fields) to reach field 22.
  for (int field = 3; field < 22 && *p; ++field) {
    p = std::strchr(p, ' ');
    if (!p) return st;
    ++p;
  }
  char* end = nullptr;
  st.start_time = std::strtoull(p, &end, 10);
  st.ok = end != p;
  return st;
}

}  // namespace

ProcessId ProcessId::self() {
  ProcessId id;
  id.pid = static_cast<int32_t>(getpid());
  const ProcStat st = readProcStat(getpid());
  id.start_time = st.ok ? st.start_time : 0;
  return id;
}

bool ProcessId::alive() const {
  if (pid <= 0) return true;  // never recorded: nothing to judge by
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  const ProcStat st = readProcStat(pid);
  if (!st.ok) return true;  // no /proc: trust kill()
  if (st.state == 'Z' || st.state == 'X') return false;
  if (start_time != 0 && st.start_time != start_time) return false;  // pid reused
  return true;
}

}  // namespace hvdtorch
