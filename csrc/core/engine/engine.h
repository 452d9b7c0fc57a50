// The engine: a tensor queue feeding a control thread (negotiation, response
// cache, fusion planning) that feeds an executor thread (the collectives).
//
//   submit() --> incoming queue --> control thread: one cycle every
//   HVDTORCH_CYCLE_TIME agrees on the ready ops (then, for each process set
//   with work anywhere, among the set's ranks), plans work units -->
//   executor queue --> executor thread runs reducers, completes OpStates
//   --> poll()/wait() through handles.
//
// The Engine is the facade over the parts that do each job, and owns them:
//  * the shared state of its threads (engine_state.h: the incoming queue,
//    names and handles of the ops in flight, the engine's failure), which
//    submit(), state(), release() and shutdown() serve from here;
//  * the process sets (process_set_table.h: ids, add/remove, equipping a
//    member's set with contexts, router, executor, control plane);
//  * the control thread (negotiation/controller.h: the cycle, the AND and
//    the star, turning answers into work units, negotiation failures);
//  * the executor thread (execution/work_queue.h: the unit queue, running a
//    unit on its set's Executor, the held units of a closed link). A small
//    unit skips the queue when the executor is idle and runs on the control
//    thread, saving the op one thread hand-off. Every op's hand-off times
//    are logged (op_timing.h, latencyLog()).
//
// Every rank's control thread runs the same cycles in lockstep, and the
// executor receives the same units in the same order on every rank, which is
// what makes the collectives match without the caller ordering anything.
// Process sets keep that property (process_set.h says how).
//
// Failure model: an error inside one op (mismatch, bad root, timeout of a
// negotiation) fails that op on every rank and the engine goes on. A
// transport failure (peer died, deadline on a link) leaves ranks in unknown
// states, so it fails every pending op and every later submit with the
// original message, naming the rank that saw it. A rank that stops on a
// failure tells the others why (its last word on the control links, or the
// shutdown the coordinator sends everyone) before it closes its links; so a
// link that merely closed (PeerClosed) is not reported at once: its op waits
// up to reasonGrace() (engine_state.h) for the control thread to learn the cause, and names
// it, and only blames the closing peer itself when no cause comes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/reducer_set.h"
#include "config/config.h"
#include "engine/engine_state.h"
#include "engine/execution/entry.h"
#include "engine/execution/executor.h"
#include "engine/execution/work_queue.h"
#include "engine/negotiation/control_plane.h"
#include "engine/negotiation/controller.h"
#include "engine/op_timing.h"
#include "engine/process_set.h"
#include "engine/process_set_table.h"
#include "timeline/timeline.h"
#include "transport/context.h"

namespace hvdtorch {

class Engine {
 public:
  struct Transports {
    Context::LinkFactory control;         // links for negotiation (own process group)
    Context::LinkFactory data;            // links for collectives between hosts
    Context::LinkFactory local;           // same-host links; empty: shared memory when shm_token is set
    NativeCollectives* native = nullptr;  // the data group's own collectives
    // Job-unique token shared by every rank (names the shared-memory
    // segments). Empty, or HVDTORCH_SHM=0: no shared memory at all.
    std::string shm_token;
  };

  // `ops`: the op table, ops' (ops/op_table.h) outside tests; it becomes the
  // process's table in use (useOpTable, engine/op_spec.h).
  Engine(Config config, const Topology& topo, const Transports& transports, const std::vector<OpSpec>& ops);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues an op and returns its handle. Throws InvalidArgument for a name
  // already pending on this rank, CollectiveError once the engine has failed
  // or shut down. The entry is taken as built: the per-op entry functions in
  // csrc/core/ops build and check it.
  int64_t submit(EntryPtr entry);
  // The state behind a handle (throws InvalidArgument for an unknown one).
  std::shared_ptr<OpState> state(int64_t handle);
  // Forgets the handle; a finished op's timestamps go to latencyLog().
  void release(int64_t handle);

  // Stops this rank and, through the next cycle, every other rank. Pending
  // ops fail with a message naming the rank that shut down. Idempotent.
  void shutdown();

  // Process sets (process_set.h). addProcessSet registers one on this rank
  // and returns its id, the smallest unused one: every rank must add (and
  // remove) the same sets in the same order, and must not submit to a new
  // set before every rank has added it (hvdtorch.add_process_set is a
  // collective that ensures both). `ranks`: distinct global ranks, any
  // order, at least one. Throws InvalidArgument for a bad list or one equal
  // to an existing set's. `native`: the backend's own collectives over the
  // set's ranks (its process groups), or null; it must outlive the set.
  // removeProcessSet: id 0, unknown ids, and a set with ops still
  // outstanding on this rank are errors. Every member removes it once all
  // members are done with it, and no op may run on any rank until every
  // member has (hvdtorch.remove_process_set: between two barriers): the
  // set's device rings close with their handshake (device_ring.h), whose
  // messages travel on links the other sets share, and which waits for the
  // neighbours to do the same.
  int32_t addProcessSet(std::vector<int> ranks, NativeCollectives* native = nullptr);
  void removeProcessSet(int32_t id);
  // The set with this id, or null (never added, or removed).
  std::shared_ptr<const ProcessSet> processSet(int32_t id) const;
  std::vector<std::shared_ptr<const ProcessSet>> processSets() const;

  // Negotiation rounds run by this rank (every set): how many took the
  // decentralized AND alone, how many went through a coordinator.
  struct NegotiationStats {
    uint64_t decentralized = 0;
    uint64_t star = 0;
  };
  NegotiationStats negotiationStats() const { return {controller_.andRounds(), controller_.starRounds()}; }
  // The hand-off phases of the last ops released after they finished
  // (op_timing.h): what a small op's latency is made of.
  LatencyLog& latencyLog() { return latency_; }

  const Topology& topo() const { return data_ctx_.topo(); }
  // The config as loaded at init; the two settings below may since differ.
  const Config& config() const { return config_; }

  // Run-time settings (autotune: hvdtorch/autotune.py). The fusion
  // threshold decides which ops share a work unit, so every rank must change
  // it at the same point of its op sequence with none of its own ops
  // outstanding: an op is planned only once every rank submitted it, so then
  // every rank plans it under the new value. The cycle time only paces this
  // rank's control thread. Both are safe to call from any thread.
  void setFusionThreshold(size_t bytes) { controller_.setFusionThreshold(bytes); }
  size_t fusionThreshold() const { return controller_.fusionThreshold(); }
  void setCycleTime(std::chrono::microseconds t) { controller_.setCycleTime(t); }
  std::chrono::microseconds cycleTime() const { return controller_.cycleTime(); }
  ReducerSet& reducers() { return router_.reducers(); }
  const ReducerSet& reducers() const { return router_.reducers(); }
  Context& dataContext() { return data_ctx_; }
  const Context& dataContext() const { return data_ctx_; }
  // Started and stopped at run time by hvd.start_timeline()/stop_timeline().
  Timeline& timeline() { return timeline_; }
  // This rank's registered buffers (DistributedModel's buckets allocate
  // there); null when shared memory is off or the job has no token.
  const std::shared_ptr<RegisteredMemory>& registered() const { return registered_; }
  // The job's shared-memory token ("" when shared memory is off): what
  // other users of shared memory name their segments after (makeShmPrefix).
  const std::string& shmToken() const { return shm_token_; }
  // Bytes of the host fusion buffer, which grows to the largest fused unit
  // (or reduce-scatter) so far and stays; any thread may ask.
  size_t fusionBufferBytes() const { return executor_.fusionBytes(); }
  // What the engine's parts run with, each read from the part that uses it
  // (not from Config), so that a knob that never reaches its user shows:
  // "cache_capacity" (the global set's response cache),
  // "staging_segment_bytes" (the executor's) and "<reducer>.<setting>" for
  // every reducer that can run here (Reducer::settings). hvd.check prints
  // them; tests read the knobs back from them.
  std::map<std::string, int64_t> settingsInUse() const;
  // All-reduces this process ran on the device ring (algorithms/device_ring.h), for tests.
  static uint64_t deviceRingRuns();

 private:
  // Calls `what` on the router of every process set this rank is a member
  // of (the work queue's ring teardown and release).
  std::function<void()> onMemberRouters(void (Router::*what)());
  static std::shared_ptr<RegisteredMemory> makeRegistered(const Config& config, const Topology& topo,
                                                          const std::string& shm_token);
  // Same-host links of one plane ("c" control, "d" data): shared memory
  // unless HVDTORCH_SHM=0 or no token was given.
  static Context::LinkFactory localLinks(const Config& config, const Topology& topo, const Transports& t,
                                         const std::string& plane);
  // How long a shared-memory wait spins before it sleeps, when the host's
  // ranks do not outnumber its cores: a little more than a small op's
  // usual skew between two ranks, measured with benchmarks/allreduce.py
  // --breakdown.
  static constexpr std::chrono::microseconds kShmSpinBudget{20};

  // Declared in the order they are built; each is gone before what it uses.
  Config config_;
  Timeline timeline_;
  Context control_ctx_;
  Context data_ctx_;
  std::shared_ptr<RegisteredMemory> registered_;  // before router_ and executor_, which use it
  Router router_;                                 // before executor_, which uses it (and is gone first)
  Executor executor_;
  ControlPlane control_;
  std::string shm_token_;
  LatencyLog latency_;

  EngineState st_;
  ProcessSetTable sets_;  // after the parts the global set uses
  // Its queued and held units keep removed sets alive: gone before sets_.
  WorkQueue work_;
  Controller controller_;
};

}  // namespace hvdtorch
