// The engine's control thread, its controller: one cycle every
// HVDTORCH_CYCLE_TIME (while any rank has work) takes the ops submitted since
// the last (EngineState::incoming), agrees with the other ranks on which are
// ready everywhere -- the global set first, then, for each process set with
// work anywhere, among the set's ranks --, plans the ready ones into work
// units (negotiation/fusion_plan.h) and pushes them to the executor
// (execution/work_queue.h). Every rank's controller runs the same cycles in
// lockstep and plans the same units in the same order, which is what makes
// the collectives match without the caller ordering anything.
//
// Negotiation, per set and cycle, takes one of two paths:
//  * the steady state (Romero et al., NSDI'22): every rank's pending ops
//    are in the response cache, so a bitwise-AND all-reduce of the ranks'
//    cache bits (ControlPlane::andAll, O(log N) messages per rank) tells
//    every rank which ops are ready everywhere; they run in cache-id order.
//    No coordinator takes part.
//  * the star: every rank sends its RankMessage to the coordinator (rank 0,
//    or the set's first rank) and gets the ResponseList back. It runs in a
//    cycle where some rank needs it, which that rank says through a status
//    bit in the same AND: a request not in the cache (first sight, changed
//    signature, evicted), shutdown or failure, a join, busy process sets
//    past id 63, or a cached op that has waited longer than
//    coordinatorGrace() for the other ranks (the coordinator then times
//    the stall, warns and fails it exactly as before, at most that grace
//    late). HVDTORCH_DECENTRALIZED=0 takes the star every cycle.
//
// Failures it handles (the engine's failure model: engine.h): a shutdown in
// the global answer stops every rank in the same cycle (stopOnShutdown); an
// exchange that fails stops this rank, which fails everything it holds and
// sends the other ranks its last word (onNegotiationFailure).
//
// Threads and locks: everything here runs on the control thread, except the
// run-time settings and the stats (atomics, any thread) and lingerUntil()
// (Engine::shutdown, after join()). The sets' negotiation state (fresh,
// pending, cached_pending, cache, coordinator: process_set.h) is this
// thread's alone; what it shares with the callers and the executor is
// EngineState (under its mu) and the work queue (under its own lock).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "engine/engine_state.h"
#include "engine/execution/work_queue.h"
#include "engine/negotiation/fusion_plan.h"
#include "engine/process_set_table.h"
#include "engine/request.h"
#include "timeline/timeline.h"

namespace hvdtorch {

class Controller {
 public:
  // Everything it is given outlives it.
  Controller(const Config& config, EngineState& state, ProcessSetTable& sets, WorkQueue& work, Timeline& timeline);
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  // Starts the control thread; join() waits for it to stop (after a
  // shutdown in the global answer, or a failed exchange).
  void start();
  void join();

  // Run-time settings (Engine::setFusionThreshold, setCycleTime: engine.h
  // says when they may change), read by the control thread every cycle.
  void setFusionThreshold(size_t bytes) { fusion_threshold_ = bytes; }
  size_t fusionThreshold() const { return fusion_threshold_; }
  void setCycleTime(std::chrono::microseconds t) { cycle_time_us_ = t.count(); }
  std::chrono::microseconds cycleTime() const { return std::chrono::microseconds(cycle_time_us_.load()); }
  // Negotiation rounds run (every set): the decentralized AND alone, or the star.
  uint64_t andRounds() const { return and_rounds_.load(); }
  uint64_t starRounds() const { return star_rounds_.load(); }
  // When the control links may close after this rank sent its last word;
  // read after join().
  std::chrono::steady_clock::time_point lingerUntil() const { return linger_until_; }

 private:
  void loop();
  // One cycle: the global set's exchange, then every busy set's, in id order.
  void runCycle();
  // runCycle's steps: takes the submitted entries (and whether this rank
  // stops) into msg; hands each entry to its set (failing those whose set
  // was removed); on a shutdown in the list, fails everything pending with
  // the cause and stops the control loop.
  std::deque<EntryPtr> takeIncoming(RankMessage& msg);
  void sortIntoSets(std::deque<EntryPtr> fresh, const std::vector<std::shared_ptr<ProcessSet>>& sets);
  void stopOnShutdown(const ResponseList& list);
  void runSetCycle(const std::shared_ptr<ProcessSet>& ps);
  // Moves the set's fresh entries to pending and fills msg's cache bits and
  // uncached requests.
  void prepareMessage(ProcessSet& ps, RankMessage& msg);
  // This cycle's ResponseList for one set: the AND, then the star only if
  // some member needs it (see the top of this file). For the global set,
  // msg carries shutdown and the busy sets, and so does the list.
  ResponseList negotiate(ProcessSet& ps, const RankMessage& msg);
  ResponseList starExchange(ProcessSet& ps, const RankMessage& msg);
  // Whether this rank needs the coordinator this cycle.
  bool needsCoordinator(const ProcessSet& ps, const RankMessage& msg) const;
  // How long a cached op may wait for other ranks before this rank asks for
  // the coordinator, which times stalls: 100 ms, or a tenth of the stall
  // warning or timeout when that is shorter.
  std::chrono::milliseconds coordinatorGrace() const;
  // The ops `list` made ready in this set, as the fusion planner takes them.
  std::vector<ReadyOp> takeReady(ProcessSet& ps, const ResponseList& list);
  // Plans the units and pushes them to the work queue (which runs small
  // ones on this thread when the executor is idle).
  void queueUnits(const std::shared_ptr<ProcessSet>& ps, std::vector<ReadyOp> ready);
  // What a joined rank runs for an op it never submitted (Response::stand_in):
  // zeros on a device of the peers' kind (the one of that kind this rank
  // last submitted from; index 0 if none), outputs dropped.
  EntryPtr makeStandIn(const Request& req);
  // The exchange failed (`why`): fail everything, send the other ranks this
  // rank's last word.
  void onNegotiationFailure(const std::string& why);
  // Fails every op this thread holds, in every set.
  void failNegotiating(const std::function<std::string(const EntryPtr&)>& why);

  const Config& config_;
  EngineState& st_;
  ProcessSetTable& sets_;
  WorkQueue& work_;
  Timeline& timeline_;
  const std::shared_ptr<ProcessSet> global_;
  const int rank_;

  bool others_busy_ = false;  // some set had work somewhere last cycle
  // Read by Engine::shutdown() after joining the thread.
  std::chrono::steady_clock::time_point linger_until_{};
  std::atomic<uint64_t> and_rounds_{0};
  std::atomic<uint64_t> star_rounds_{0};
  // Start as config_'s.
  std::atomic<size_t> fusion_threshold_{0};
  std::atomic<int64_t> cycle_time_us_{0};

  std::thread thread_;
};

}  // namespace hvdtorch
