// A process set as the engine runs it: a list of global ranks with its own
// negotiation (response cache, coordinator at the set's first rank, stall
// check) over views of the job's control and data contexts (set rank i is
// global rank ranks[i], on the same links), and its own router (reducers
// and device routes, algorithms/router.h). The global set (id 0, every
// rank) is one of them and uses the engine's own contexts.
//
// How sets run (Controller::runCycle, negotiation/controller.h): every cycle starts with the global set's
// exchange, in which each rank also reports the sets it has work in (as idle
// bits in the AND of a cached cycle, or in its message to the coordinator),
// so that every rank learns their union; then every member of each busy set
// runs that set's exchange, in id order. All ranks therefore agree on
// which exchanges happen in which order, and the units they produce reach
// the one executor thread of every rank in one global order: a unit runs
// once every member reached it, so sets that share ranks (and links) never
// wait on each other in a cycle, and disjoint sets' ops run at the same
// time on their different ranks.
//
// The sets live in the engine's ProcessSetTable (process_set_table.h), which
// makes and equips them. Fields are written by the control thread, except
// `outstanding` (the submitting thread and the completion hook) and what
// the table sets while it adds one. Ids are agreed because every rank adds
// and removes sets in the same order (a collective in Python).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "algorithms/router.h"
#include "engine/execution/entry.h"
#include "engine/execution/executor.h"
#include "engine/execution/work_queue.h"
#include "engine/negotiation/control_plane.h"
#include "engine/negotiation/coordinator.h"
#include "engine/negotiation/response_cache.h"
#include "transport/context.h"

namespace hvdtorch {

struct ProcessSet {
  int32_t id = 0;
  std::vector<int> ranks;  // global ranks, ascending
  int set_rank = -1;       // this rank's index in `ranks`; -1: not a member
  // The backend's collectives over these ranks (ProcessSetTable::add);
  // the global set's are the data context's.
  NativeCollectives* native = nullptr;

  // Where the set's traffic goes. The global set points at the engine's own
  // parts; other sets own theirs (the own_* members), built only on members.
  Context* control = nullptr;
  Context* data = nullptr;
  Router* router = nullptr;
  Executor* executor = nullptr;
  ControlPlane* plane = nullptr;
  std::unique_ptr<Context> own_control, own_data;
  std::unique_ptr<Router> own_router;  // before own_executor, which uses it (and is gone first)
  std::unique_ptr<Executor> own_executor;
  std::unique_ptr<ControlPlane> own_plane;
  // Where its units run (WorkQueue::push): `executor`, and its name for errors.
  UnitSite site;

  // Negotiation state (control thread).
  std::unique_ptr<ResponseCache> cache;
  std::unique_ptr<Coordinator> coordinator;           // on the set's first rank
  std::deque<EntryPtr> fresh;                         // submitted, not yet sent to the coordinator
  std::unordered_map<std::string, EntryPtr> pending;  // sent, awaiting a response
  struct CachedOp {
    std::string name;
    std::chrono::steady_clock::time_point since;  // reported by its bit from then on
  };
  std::unordered_map<uint32_t, CachedOp> cached_pending;  // cache id -> op

  std::atomic<int> outstanding{0};  // ops of this set submitted here and not finished

  bool member() const { return set_rank >= 0; }
  bool busy() const { return !fresh.empty() || !pending.empty() || !cached_pending.empty(); }
  // "process set 1 [0, 2]"
  std::string describe() const;
};

}  // namespace hvdtorch
