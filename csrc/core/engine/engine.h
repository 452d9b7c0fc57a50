// The engine: a tensor queue feeding a control thread (negotiation, response
// cache, fusion planning) that feeds an executor thread (the collectives).
//
//   submit() --> incoming queue --> control thread: one cycle every
//   HVDTORCH_CYCLE_TIME agrees on the ready ops (then, for each process set
//   with work anywhere, among the set's ranks), plans work units -->
//   executor queue --> executor thread runs reducers, completes OpStates
//   --> poll()/wait() through handles.
//
// A small unit (kInlineUnitBytes) skips the executor queue when the
// executor is idle: the control thread runs it at once, saving the op one
// thread hand-off; so a cached small op whose peers are all ready pays two
// wake-ups in all (the control thread's, then the caller's). Every op's
// hand-off times are logged (op_timing.h, latencyLog()).
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
// up to reasonGrace() for the control thread to learn the cause, and names
// it, and only blames the closing peer itself when no cause comes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "algorithms/reducer_set.h"
#include "config/config.h"
#include "engine/execution/entry.h"
#include "engine/execution/executor.h"
#include "engine/negotiation/control_plane.h"
#include "engine/negotiation/coordinator.h"
#include "engine/negotiation/response_cache.h"
#include "engine/op_timing.h"
#include "engine/process_set.h"
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
  NegotiationStats negotiationStats() const { return {and_rounds_.load(), star_rounds_.load()}; }
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
  void setFusionThreshold(size_t bytes) { fusion_threshold_ = bytes; }
  size_t fusionThreshold() const { return fusion_threshold_; }
  void setCycleTime(std::chrono::microseconds t) { cycle_time_us_ = t.count(); }
  std::chrono::microseconds cycleTime() const { return std::chrono::microseconds(cycle_time_us_.load()); }
  ReducerSet& reducers() { return router_.reducers(); }
  const ReducerSet& reducers() const { return router_.reducers(); }
  Context& dataContext() { return data_ctx_; }
  const Context& dataContext() const { return data_ctx_; }
  // Started and stopped at run time by hvd.start_timeline()/stop_timeline().
  Timeline& timeline() { return timeline_; }
  // This rank's registered buffers (DistributedModel's buckets allocate
  // there); null when shared memory is off or the job has no token.
  const std::shared_ptr<RegisteredMemory>& registered() const { return registered_; }
  // Bytes of the host fusion buffer, which grows to the largest fused unit
  // (or reduce-scatter) so far and stays; any thread may ask.
  size_t fusionBufferBytes() const { return executor_.fusionBytes(); }

 private:
  void controlLoop();
  void executorLoop();
  // One cycle: the global set's exchange, then every busy set's, in id order.
  void runCycle();
  // runCycle's steps: takes the submitted entries (and whether this rank
  // stops) into msg; hands each entry to its set (failing those whose set
  // was removed); on a shutdown in the list, fails everything pending with
  // the cause and stops the control loop.
  std::deque<EntryPtr> takeIncoming(RankMessage& msg);
  void sortIntoSets(std::deque<EntryPtr> fresh, const std::vector<std::shared_ptr<ProcessSet>>& sets);
  void stopOnShutdown(const ResponseList& list);
  static std::shared_ptr<ProcessSet> findIn(const std::vector<std::shared_ptr<ProcessSet>>& sets, int32_t id);
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
  // Plans the units and hands them to the executor, running small ones
  // on this (the control) thread when the executor is idle.
  void queueUnits(const std::shared_ptr<ProcessSet>& ps, std::vector<ReadyOp> ready);
  // What a joined rank runs for an op it never submitted (Response::stand_in):
  // zeros on a device of the peers' kind (the one of that kind this rank
  // last submitted from; index 0 if none), outputs dropped.
  EntryPtr makeStandIn(const Request& req);
  // The control thread's exchange failed (`why`): fail everything, send
  // the other ranks this rank's last word.
  void onNegotiationFailure(const std::string& why);
  // Fails every op the control thread holds, in every set.
  void failNegotiating(const std::function<std::string(const EntryPtr&)>& why);
  std::vector<std::shared_ptr<ProcessSet>> setsSnapshot() const;  // ascending ids
  // A set of `ranks` (ascending) as seen by global rank `rank`, and the one
  // builder of a member's resources: the global set (id 0) gets the
  // engine's own contexts, router and executor, another set views of the
  // contexts and its own router (the job's calibration), executor and
  // control plane; every set its response cache, and its coordinator on its
  // first rank.
  static std::shared_ptr<ProcessSet> newSet(int32_t id, std::vector<int> ranks, int rank);
  void equipSet(ProcessSet& ps);
  std::shared_ptr<ProcessSet> findSet(int32_t id) const;
  void failEverything(const std::string& why);
  // How long a rank that closes its links after its last word keeps them
  // open first (shutdown()), and how long a unit whose link closed waits
  // for the cause (settleHeld()): a quarter of the timeout, at most 1 s.
  // The peer's reason was posted at least this long before its links
  // closed, so a receiver has twice this long to read it.
  std::chrono::milliseconds reasonGrace() const;
  // Finishes the held units (runUnit) once the cause is known: the
  // failure the control thread recorded meanwhile (a peer's last word or
  // shutdown, or its own lost contact) leads their error, what their link
  // said follows. When reasonGrace() passed or the control thread stopped
  // without one, the first held unit's own error becomes this rank's
  // failure (the closing peer is blamed). Called by the control thread
  // after every cycle, by the executor when the grace ends, and at shutdown.
  void settleHeld();
  void warn(const std::string& msg);
  static ReducerEnv reducerEnv(const Config& config, const std::string& shm_token, int32_t set_id,
                               std::shared_ptr<RegisteredMemory> registered);
  static std::shared_ptr<RegisteredMemory> makeRegistered(const Config& config, const Topology& topo,
                                                          const std::string& shm_token);
  // Same-host links of one plane ("c" control, "d" data): shared memory
  // unless HVDTORCH_SHM=0 or no token was given.
  static Context::LinkFactory localLinks(const Config& config, const Topology& topo, const Transports& t,
                                         const std::string& plane);

  Config config_;
  Timeline timeline_;
  Context control_ctx_;
  Context data_ctx_;
  std::shared_ptr<RegisteredMemory> registered_;  // before router_ and executor_, which use it
  Router router_;                                 // before executor_, which uses it (and is gone first)
  Executor executor_;
  ControlPlane control_;

  std::string shm_token_;

  std::mutex mu_;
  std::map<DeviceKind, int> device_index_;  // under mu_: per kind, the device of this rank's last op of it
  std::condition_variable incoming_cv_;
  std::deque<EntryPtr> incoming_;
  // "<set id>:<name>" of every op submitted here and not finished (released
  // by OpState's on-done hook): names are unique per set.
  std::unordered_set<std::string> pending_names_;
  std::unordered_map<int64_t, std::shared_ptr<OpState>> handles_;
  int64_t next_handle_ = 1;
  bool shutdown_requested_ = false;
  bool stopped_ = false;
  std::string failure_;  // set once the engine can no longer run collectives

  mutable std::mutex sets_mu_;
  std::map<int32_t, std::shared_ptr<ProcessSet>> sets_;  // by id; 0 is the global set
  std::shared_ptr<ProcessSet> global_;
  bool others_busy_ = false;  // control thread: some set had work somewhere last cycle
  // Control thread, read by shutdown() after joining it: when the control
  // links may close after this rank sent its last word.
  std::chrono::steady_clock::time_point linger_until_{};
  std::atomic<uint64_t> and_rounds_{0};
  std::atomic<uint64_t> star_rounds_{0};
  // Start as config_'s; read by the control thread every cycle.
  std::atomic<size_t> fusion_threshold_{0};
  std::atomic<int64_t> cycle_time_us_{0};
  LatencyLog latency_;

  struct QueuedUnit {
    std::shared_ptr<ProcessSet> set;  // keeps a removed set alive until its last unit ran
    WorkUnit unit;
  };
  // Runs one unit and finishes its ops; a transport error fails everything.
  // A unit whose link closed (PeerClosed), and every unit after it, is held
  // instead (held_) until settleHeld() knows the cause; `item` is moved
  // from then. Called by exactly one thread at a time: whoever set exec_busy_.
  void runUnit(QueuedUnit& item);
  struct HeldUnit {
    QueuedUnit item;
    std::string failed;  // "rank R: <op> '<name>' failed: "
    std::string seen;    // what its link said; empty: it never ran
  };
  std::vector<HeldUnit> held_;                          // under mu_
  std::chrono::steady_clock::time_point held_until_{};  // under mu_: when settleHeld() stops waiting
  // Units up to this size run on the control thread when the executor is
  // idle (queueUnits): for them the hand-off costs more than the work.
  static constexpr size_t kInlineUnitBytes = size_t(64) << 10;
  static bool runsInline(const WorkUnit& unit);
  // How long a shared-memory wait spins before it sleeps, when the host's
  // ranks do not outnumber its cores: a little more than a small op's
  // usual skew between two ranks, measured with benchmarks/allreduce.py
  // --breakdown.
  static constexpr std::chrono::microseconds kShmSpinBudget{20};
  std::mutex exec_mu_;
  std::condition_variable exec_cv_;
  std::deque<QueuedUnit> exec_queue_;
  bool exec_busy_ = false;  // a unit is running (on the executor, or inline on the control thread)
  bool exec_stop_ = false;
  // Set when every rank stops cleanly (stopOnShutdown): the executor closes
  // its device rings (a collective) once the units already queued have run.
  bool close_device_rings_ = false;
  // held_until_ while units are held, for the executor to wake and settle
  // them; time_point::max() otherwise.
  std::chrono::steady_clock::time_point settle_at_ = std::chrono::steady_clock::time_point::max();

  std::thread control_thread_;
  std::thread executor_thread_;
};

}  // namespace hvdtorch
