// Chrome-trace timeline (chrome://tracing, Perfetto), Horovod-style: one
// trace "process" per op name, and for every op the phases it went through:
//   NEGOTIATE          submitted, waiting for every rank to submit it
//   QUEUE              agreed on, waiting for the executor
//   MEMCPY_IN_FUSION   copied (and prescaled) into the fusion buffer
//   ALLREDUCE:<algo>   the collective itself (ALLGATHER, BROADCAST, ALLTOALL,
//                      REDUCESCATTER; a barrier or join records none)
//   MEMCPY_OUT_FUSION  copied (and postscaled) out of the fusion buffer
// With mark_cycles, every negotiation cycle of the control thread is an
// instant event CYCLE_START in a trace process of its own.
//
// Opened by HVDTORCH_TIMELINE=path at construction, or at any time by
// start() (hvd.start_timeline) and closed by stop(): rank 0 writes `path`; a
// path containing "{rank}" makes every rank write its own file. All calls are
// thread-safe: the control and executor threads write events while the
// Python thread starts and stops. Events are written under a lock; a phase
// cut by start/stop shows as a lone begin or end, which trace viewers accept.
#pragma once

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <string>
#include <unordered_map>

namespace hvdtorch {

class Timeline {
 public:
  // An empty path, or a path without {rank} on a rank other than 0, gives a
  // disabled timeline whose calls cost one atomic load.
  Timeline(const std::string& path, int rank);
  ~Timeline();

  // Closes the current file, if any, and starts writing `path` (same rules
  // as the constructor). Throws InvalidArgument, and stays closed, when the
  // file cannot be written.
  void start(const std::string& path, int rank, bool mark_cycles);
  // Finishes the file (a valid JSON array). Idempotent.
  void stop();
  void close() { stop(); }

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void begin(const std::string& op, const std::string& phase);
  void end(const std::string& op, const std::string& phase);
  void markCycle();

 private:
  void event(const std::string& op, const std::string& phase, char ph);
  void closeLocked();
  int pidOf(const std::string& op);
  int64_t nowUs() const;
  void separator();

  std::atomic<bool> enabled_{false};
  bool mark_cycles_ = false;
  std::mutex mu_;
  std::ofstream out_;
  bool first_ = true;
  std::chrono::steady_clock::time_point start_;
  std::unordered_map<std::string, int> pids_;
};

}  // namespace hvdtorch
