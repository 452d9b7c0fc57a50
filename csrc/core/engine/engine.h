// The engine: a tensor queue feeding a control thread (negotiation, response
// cache, fusion planning) that feeds an executor thread (the collectives).
//
//   submit() --> incoming queue --> control thread: one cycle every
//   HVDTORCH_CYCLE_TIME, exchanges RankMessage/ResponseList with rank 0,
//   plans work units --> executor queue --> executor thread runs reducers,
//   completes OpStates --> poll()/wait() through handles.
//
// Every rank's control thread runs the same cycles in lockstep, and the
// executor receives the same units in the same order on every rank, which is
// what makes the collectives match without the caller ordering anything.
//
// Failure model: an error inside one op (mismatch, bad root, timeout of a
// negotiation) fails that op on every rank and the engine goes on. A
// transport failure (peer died, deadline on a link) leaves ranks in unknown
// states, so it fails every pending op and every later submit with the
// original message, naming the rank that saw it.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "algorithms/reducer_set.h"
#include "config/config.h"
#include "engine/control_plane.h"
#include "engine/coordinator.h"
#include "engine/entry.h"
#include "engine/executor.h"
#include "engine/response_cache.h"
#include "timeline/timeline.h"
#include "transport/context.h"

namespace hvdtorch {

class Engine {
 public:
  struct Transports {
    Context::LinkFactory control;  // links for negotiation (own process group)
    Context::LinkFactory data;     // links for collectives between hosts
    Context::LinkFactory local;    // same-host links; empty: shared memory when shm_token is set
    NativeCollectives* native = nullptr;  // the data group's own collectives
    // Job-unique token shared by every rank (names the shared-memory
    // segments). Empty, or HVDTORCH_SHM=0: no shared memory at all.
    std::string shm_token;
  };

  Engine(Config config, const Topology& topo, const Transports& transports);
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
  void release(int64_t handle);

  // Stops this rank and, through the next cycle, every other rank. Pending
  // ops fail with a message naming the rank that shut down. Idempotent.
  void shutdown();

  const Topology& topo() const { return data_ctx_.topo(); }
  const Config& config() const { return config_; }
  ReducerSet& reducers() { return reducers_; }
  const ReducerSet& reducers() const { return reducers_; }
  Context& dataContext() { return data_ctx_; }
  const Context& dataContext() const { return data_ctx_; }

 private:
  void controlLoop();
  void executorLoop();
  void runCycle(ResponseCache& cache, Coordinator* coordinator);
  void failEverything(const std::string& why);
  void warn(const std::string& msg);
  static ReducerEnv reducerEnv(const Config& config, const Transports& t);
  // Same-host links of one plane ("c" control, "d" data): shared memory
  // unless HVDTORCH_SHM=0 or no token was given.
  static Context::LinkFactory localLinks(const Config& config, const Topology& topo, const Transports& t,
                                         const std::string& plane);

  Config config_;
  Timeline timeline_;
  Context control_ctx_;
  Context data_ctx_;
  ReducerSet reducers_;
  Executor executor_;
  ControlPlane control_;

  std::mutex mu_;
  std::condition_variable incoming_cv_;
  std::deque<EntryPtr> incoming_;
  std::unordered_set<std::string> pending_names_;  // taken until the op finishes (OpState's on-done hook)
  std::unordered_map<int64_t, std::shared_ptr<OpState>> handles_;
  int64_t next_handle_ = 1;
  bool shutdown_requested_ = false;
  bool stopped_ = false;
  std::string failure_;  // set once the engine can no longer run collectives

  // Control-thread state.
  std::unordered_map<std::string, EntryPtr> pending_;   // submitted, not yet ready
  std::unordered_map<uint32_t, std::string> cached_pending_;  // cache id -> name

  std::mutex exec_mu_;
  std::condition_variable exec_cv_;
  std::deque<WorkUnit> exec_queue_;
  bool exec_stop_ = false;

  std::thread control_thread_;
  std::thread executor_thread_;
};

}  // namespace hvdtorch
