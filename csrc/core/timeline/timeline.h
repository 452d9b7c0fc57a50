// Chrome-trace timeline (chrome://tracing, Perfetto), Horovod-style: one
// trace "process" per op name, and for every op the phases it went through:
//   NEGOTIATE          submitted, waiting for every rank to submit it
//   QUEUE              agreed on, waiting for the executor
//   MEMCPY_IN_FUSION   copied (and prescaled) into the fusion buffer
//   ALLREDUCE:<algo>   the collective itself (ALLGATHER, BROADCAST, BARRIER)
//   MEMCPY_OUT_FUSION  copied (and postscaled) out of the fusion buffer
// Enabled by HVDTORCH_TIMELINE=path: rank 0 writes `path`; a path containing
// "{rank}" makes every rank write its own file. Events are buffered in memory
// and written by the caller's thread under a lock, flushed at close.
#pragma once

#include <chrono>
#include <fstream>
#include <mutex>
#include <string>
#include <unordered_map>

namespace hvdtorch {

class Timeline {
 public:
  // An empty path, or a path without {rank} on a rank other than 0, gives a
  // disabled timeline whose calls cost one branch.
  Timeline(const std::string& path, int rank);
  ~Timeline();

  bool enabled() const { return enabled_; }
  void begin(const std::string& op, const std::string& phase);
  void end(const std::string& op, const std::string& phase);
  void close();

 private:
  void event(const std::string& op, const std::string& phase, char ph);
  int pidOf(const std::string& op);

  bool enabled_ = false;
  std::mutex mu_;
  std::ofstream out_;
  bool first_ = true;
  std::chrono::steady_clock::time_point start_;
  std::unordered_map<std::string, int> pids_;
};

}  // namespace hvdtorch
