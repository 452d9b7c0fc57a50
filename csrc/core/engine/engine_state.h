// What the three kinds of thread of one Engine share: the callers' (submit,
// handles, shutdown), the control thread's (negotiation/controller.h) and the
// executor thread's (execution/work_queue.h). Here: the ops submitted and
// not yet taken into a cycle, the names and handles of the ops in flight,
// and whether the engine stopped or failed.
//
// One mutex, `mu`, guards every field. The control thread sleeps on
// `incoming_cv` between cycles; whoever gives it a reason to cycle at once
// (a submit, shutdown, a failure it must tell the other ranks about)
// notifies it, after letting go of `mu`. No thread takes another engine lock
// (the work queue's, the process-set table's) while it holds `mu`, nor `mu`
// while it holds one of those.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "common/deadline.h"
#include "config/config.h"
#include "device/device.h"
#include "engine/execution/entry.h"
#include "engine/op_state.h"

namespace hvdtorch {

struct EngineState {
  std::mutex mu;
  std::condition_variable incoming_cv;     // the control thread waits on it (with mu)
  std::deque<EntryPtr> incoming;           // submitted, not yet taken by a cycle
  std::map<DeviceKind, int> device_index;  // per kind, the device of this rank's last op of it
  // "<set id>:<name>" of every op submitted here and not finished (released
  // by OpState's on-done hook): names are unique per set.
  std::unordered_set<std::string> pending_names;
  std::unordered_map<int64_t, std::shared_ptr<OpState>> handles;
  int64_t next_handle = 1;
  bool shutdown_requested = false;  // shutdown() was called here
  bool stopped = false;             // the control thread has stopped (or stops this cycle)
  std::string failure;              // set once the engine can no longer run collectives
};

// How long a rank that closes its links after its last word keeps them open
// first (Engine::shutdown), and how long a unit whose link closed waits for
// the cause (WorkQueue::settleHeld): peerGrace (common/deadline.h). The
// peer's reason was posted at least this long before its links closed, so a
// receiver has twice this long to read it.
inline std::chrono::milliseconds reasonGrace(const Config& config) { return peerGrace(config.timeout); }

}  // namespace hvdtorch
