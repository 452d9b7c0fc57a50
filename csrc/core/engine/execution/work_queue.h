// The executor thread and the queue that feeds it: the work units the
// control thread planned (negotiation/controller.h), each run on its process
// set's Executor (executor.h), one at a time, in the order they were pushed,
// which is the same on every rank.
//
// A small unit (kInlineUnitBytes, or what its op's row runs inline) skips the
// queue when the executor is idle: push() runs it at once on the control
// thread, saving the op one thread hand-off; so a cached small op whose peers
// are all ready pays two wake-ups in all (the control thread's, then the
// caller's). Order is kept, because the executor is then idle with an empty
// queue, and only the control thread pushes.
//
// A unit that fails is handled here (runUnit): an error of the op itself
// (InvalidArgument) fails that op only; any other error (the transport: ranks
// may have diverged) fails everything (failEverything) and becomes the
// engine's failure, which the control thread then tells the other ranks. A
// unit whose link merely closed (PeerClosed), and every unit after it, is
// held instead, until the cause is known (settleHeld): the peer may have
// closed because it learned of a failure elsewhere, and its reason may still
// be on its way (the failure model in engine.h).
//
// Threads and locks: push() is called by the control thread only; the
// executor thread runs loop(); runUnit() runs on whichever of the two set
// busy_. exec_mu_ guards the queue, busy_, stop_, close_rings_ and settle_at_;
// the engine's state mutex (EngineState::mu, engine_state.h) guards held_ and
// held_until_, beside the failure they are settled against. Neither is taken
// while the other is held.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "engine/engine_state.h"
#include "engine/execution/entry.h"
#include "engine/execution/executor.h"

namespace hvdtorch {

// Where a process set's units run (ProcessSet::site): its executor, and how a
// failed unit's error names the set ("" for the global set, " in process set
// 1 [0, 2]" otherwise).
struct UnitSite {
  Executor* executor = nullptr;
  std::string in_set;
};

class WorkQueue {
 public:
  // `rank`: this rank's, for errors. `close_rings`: the device rings'
  // teardown handshake of every set this rank is a member of, run on the
  // executor thread once every unit queued before a clean stop has run.
  // `release_ring_waits`: their DeviceRing::releaseWaits, run on whichever
  // thread fails the engine or sees it stop on an error (device work queued
  // behind a dead peer's flag then runs on instead of waiting forever).
  WorkQueue(EngineState& state, const Config& config, int rank, std::function<void()> close_rings,
            std::function<void()> release_ring_waits)
      : st_(state),
        config_(config),
        rank_(rank),
        close_rings_fn_(std::move(close_rings)),
        release_ring_waits_fn_(std::move(release_ring_waits)) {}
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Starts the executor thread.
  void start();
  // Control thread: runs `units` (planned from one set's answer, in order)
  // on `site`, small ones at once on this thread while the executor is idle,
  // the rest through the executor thread (so that the next cycle's
  // negotiation overlaps them). `site` aliases its process set, which it
  // keeps alive until the set's last unit ran.
  void push(const std::shared_ptr<const UnitSite>& site, std::vector<WorkUnit> units);
  // Control thread, when every rank stops (clean: none stopped on an error):
  // wakes the executor, which on a clean stop closes the device rings (a
  // collective) once the units already queued have run.
  void stopping(bool clean);
  // Stops the executor thread once its queue is drained, and joins it.
  void stop();

  // Fails every op not yet taken into a cycle (EngineState::incoming) and
  // every queued unit, and makes `why` the engine's failure unless one came
  // first. Any thread.
  void failEverything(const std::string& why);
  // Finishes the held units once the cause is known: the failure the control
  // thread recorded meanwhile (a peer's last word or shutdown, or its own
  // lost contact) leads their error, what their link said follows. When
  // reasonGrace() passed or the control thread stopped without one, the first
  // held unit's own error becomes this rank's failure (the closing peer is
  // blamed). Called by the control thread after every cycle, by the executor
  // when the grace ends, and by Engine::shutdown once both threads are gone.
  void settleHeld();

 private:
  struct QueuedUnit {
    std::shared_ptr<const UnitSite> site;  // keeps a removed set alive until its last unit ran
    WorkUnit unit;
  };
  struct HeldUnit {
    QueuedUnit item;
    std::string failed;  // "rank R: <op> '<name>' failed: "
    std::string seen;    // what its link said; empty: it never ran
  };
  // Units up to this size run on the control thread when the executor is
  // idle (push()): for them the hand-off costs more than the work.
  static constexpr size_t kInlineUnitBytes = size_t(64) << 10;
  static bool runsInline(const WorkUnit& unit);

  void loop();
  // Runs one unit and finishes its ops; a transport error fails everything.
  // A unit whose link closed (PeerClosed), and every unit after it, is held
  // instead (held_) until settleHeld() knows the cause; `item` is moved
  // from then. Called by exactly one thread at a time: whoever set busy_.
  void runUnit(QueuedUnit& item);

  EngineState& st_;
  const Config& config_;
  const int rank_;
  std::function<void()> close_rings_fn_;
  std::function<void()> release_ring_waits_fn_;

  std::vector<HeldUnit> held_;                          // under st_.mu
  std::chrono::steady_clock::time_point held_until_{};  // under st_.mu: when settleHeld() stops waiting

  std::mutex exec_mu_;
  std::condition_variable exec_cv_;
  std::deque<QueuedUnit> queue_;
  bool busy_ = false;  // a unit is running (on the executor, or inline on the control thread)
  bool stop_ = false;
  // Set when every rank stops cleanly (stopping()): the executor closes
  // its device rings (a collective) once the units already queued have run.
  bool close_rings_ = false;
  // held_until_ while units are held, for the executor to wake and settle
  // them; time_point::max() otherwise.
  std::chrono::steady_clock::time_point settle_at_ = std::chrono::steady_clock::time_point::max();

  std::thread thread_;
};

}  // namespace hvdtorch
