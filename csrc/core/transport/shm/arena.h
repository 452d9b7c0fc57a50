// The node arena: one shared-memory segment mapped by every local rank of a
// host, holding one slot per local rank in each of two buffer sets, one
// source record per local rank, plus a barrier. The node reducer does its
// intra-host phases in it.
//
// Source records: a local rank whose data for a round lies in a registered
// buffer (registered_memory.h) says so in its record before the round's
// first barrier instead of copying the data into its slot; the peers read
// the record after that barrier and work on the buffer in place. A record of
// all zeros (id 0) means "my data is in my slot".
//
// Local rank 0 creates the segment, the others open it (ShmSegment's
// lifetime rules apply: the name is gone once all have attached).
//
// Barrier: every local rank has its own monotonic arrival counter (one cache
// line each). barrier() publishes "I arrived for the n-th time" and waits
// until every counter is >= n; whoever sees the last arrival wakes the
// sleepers. Per-rank counters need no reset between rounds (no
// sense-reversal race) and tell a timed-out waiter exactly which local ranks
// are missing. Waiting is ShmWait's spin-yield-futex with deadlines, and a
// local rank that died or left is reported within ~100 ms.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "transport/shm/registered_memory.h"
#include "transport/shm/segment.h"

namespace hvdtorch {

class ShmArena {
 public:
  // `local_ranks[j]` is the global rank of local rank j (used in messages);
  // `local_rank` is this process's index in it. Local rank 0 creates the
  // segment `name`, the others wait for it until `deadline`.
  ShmArena(const std::string& name, int local_rank, const std::vector<int>& local_ranks, size_t slot_bytes,
           Deadline deadline);

  int localRank() const { return local_rank_; }
  int localSize() const { return static_cast<int>(local_ranks_.size()); }
  const std::string& name() const { return seg_.name(); }

  // Slot of local rank `owner` in buffer set `set` (0 or 1).
  char* slot(int set, int owner) const;

  // Local rank `owner`'s source record (see above). Written by its owner
  // before a barrier, read by the others after it and before the next one.
  RegisteredRef& source(int owner) const;

  // Returns once every local rank has entered barrier() as many times as
  // this one. Memory written before the barrier by any local rank is visible
  // after it. `what` names the phase in error messages. Past the deadline it
  // waits kLeaveGrace more for a live local rank to arrive or leave the arena
  // (PeerClosed: a rank that failed for a cause of its own), then throws
  // TimeoutError naming the ranks it waited for.
  void barrier(Deadline deadline, const char* what);
  static constexpr std::chrono::milliseconds kLeaveGrace{500};

 private:
  struct Control;
  Control* control() const;
  std::atomic<uint64_t>& arrivals(int local_rank) const;
  bool allArrived(uint64_t n) const;
  std::string missing(uint64_t n) const;

  int local_rank_;
  std::vector<int> local_ranks_;
  size_t slot_stride_;
  size_t sources_offset_;
  size_t slots_offset_;
  ShmSegment seg_;
  uint64_t barriers_ = 0;  // barriers this rank has entered
};

}  // namespace hvdtorch
