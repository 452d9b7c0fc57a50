// Identity and liveness of a process on this host, for peers that share
// memory: a waiter that sees no progress asks whether the peer still exists
// instead of waiting for its whole deadline.
//
// A pid alone is not enough: a SIGKILLed sibling stays a zombie (kill(pid, 0)
// still succeeds) until the launcher reaps it, and a reaped pid can be
// reused. So the identity is (pid, start time), and a zombie counts as dead.
// Limitation: peers must share a pid namespace (processes in separate
// containers that share /dev/shm would look dead to each other).
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace hvdtorch {

struct ProcessId {
  int32_t pid = 0;
  uint64_t start_time = 0;  // clock ticks after boot (/proc/<pid>/stat field 22); 0 if unknown

  static ProcessId self();
  // False only when the process is known to be gone: no such pid, a zombie,
  // or a different process now using the pid. Unknown means alive.
  bool alive() const;
};

}  // namespace hvdtorch
