// One gathered copy per host: the buckets of a sharded model (shard=3) that
// the local ranks of one host gather into shared memory and read in place,
// so that a host holds each gathered bucket once, not once per rank.
//
// Each local rank writes its own shard into the bucket's memory at its
// offset ("put"; on several hosts, also the shards of the ranks of its
// local rank on the other hosts, which it gathered among them first: each
// byte crosses a host's link once), and once every local rank has put its
// part ("await") the whole bucket is there for all of them, with no copy
// out: all-gathering a bucket among the ranks of one host is a copy of one's
// own shard and a wait.
//
// Slots. A gathered bucket lives in a slot: a shared-memory segment of the
// largest bucket's size, from a pool the host's ranks share. The first rank
// to put a gather of a bucket takes a free slot for it (or makes a new one),
// the others find it in the bucket's record, and the last rank to release
// the gather frees the slot for any bucket's next gather. So the host holds
// as many slots as buckets were ever in use at once (the running unit, the
// prefetched one: the same bound as a rank's own gathers in a pool), and
// their pages stay committed: handing pages back at each release and
// faulting them in again at the next put cost more than the copy itself
// (a 16 MiB bucket: ~20 ms against ~1 ms, measured here).
//
// Generations. A bucket is gathered and released many times (forward,
// backward, after each step with new values). Every local rank counts its
// own gathers of each bucket; the n-th gather on one rank meets the n-th on
// the others, as the collectives they replace would (every rank gathers the
// same buckets in the same order: the caller's contract). Gather n of a
// bucket puts nothing before every local rank has released gather n - 1: a
// rank still reading the old values (the previous backward) never sees new
// ones written under it.
//
// Memory layout. A control segment (created at construction by local rank
// 0, the others open it) holds a signal, the number of slots made, per slot
// who made it and which gather holds it, and per bucket: the last gather
// released everywhere, a release count that picks the one rank that frees
// the slot, the slot of the current gather, and each local rank's last
// gather put and released (so that a timed-out wait names the ranks it
// waited for). Slots are segments of their own ("<name>-s<k>"), made by the
// rank that needs one: a full /dev/shm is an error then (ShmSegment
// reserves the pages). They follow ShmSegment's lifetime rules: nothing is
// left in /dev/shm once every local rank has mapped them, or once their
// maker is gone.
//
// Contract:
//  * Not thread-safe: one thread of each rank calls it (the Python thread
//    that runs forward and backward).
//  * put(j) then await(j) then release(j), in this order for each gather of
//    bucket j; put may be called with wait=false first (returns false when
//    the previous gather is not yet released everywhere: call it again,
//    with wait=true at the latest).
//  * The memory await() returns stays mapped while any copy of the
//    shared_ptr lives; after release() its contents are undefined (another
//    bucket's gather may be written there), never unmapped under a reader.
//  * Waits end at the deadline (TimeoutError naming the local ranks waited
//    for) or when a local rank died or left (CollectiveError/PeerClosed).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "transport/shm/segment.h"

namespace hvdtorch {

class HostGather {
 public:
  // `name`: a job-unique shm name prefix for this instance (every local rank
  // passes the same). `party`: this rank's index in `party_ranks`, the global
  // ranks of the host taking part (messages name them). `bucket_bytes[j]`:
  // bucket j's size (> 0). `timeout`: how long each wait may take.
  HostGather(std::string name, int party, std::vector<int> party_ranks, std::vector<size_t> bucket_bytes,
             std::chrono::milliseconds timeout);
  ~HostGather();
  HostGather(const HostGather&) = delete;
  HostGather& operator=(const HostGather&) = delete;

  // Bytes this rank writes into a bucket: `bytes` from `src` at `offset`.
  struct Piece {
    const void* src;
    size_t offset;
    size_t bytes;
  };
  // Writes `pieces` into bucket j for this rank's next gather of it (its
  // own shard; across hosts, the shards it gathered from its column too),
  // once every local rank has released the previous gather; false (nothing
  // written yet) if `wait` is false and they have not.
  bool put(int j, const std::vector<Piece>& pieces, bool wait);
  // Waits until every local rank has put its part of this gather of bucket j
  // and returns the bucket's memory (kept mapped by the shared_ptr).
  std::shared_ptr<char> await(int j);
  // This rank is done reading this gather of bucket j.
  void release(int j);

  int parties() const { return static_cast<int>(party_ranks_.size()); }
  size_t buckets() const { return bucket_bytes_.size(); }
  // Gathers of bucket j this rank has begun (for tests).
  uint64_t generation(int j) const { return local_[j].gen; }
  // Slots made on this host so far (for tests).
  int slots() const;

 private:
  struct Record;
  struct SlotRecord;
  enum class Stage { kIdle, kBegun, kPut, kHeld };
  struct Local {
    uint64_t gen = 0;  // gathers of the bucket this rank has begun
    Stage stage = Stage::kIdle;
    int slot = -1;  // the slot of the current gather, once put
  };
  Record record(int j) const;
  SlotRecord slotRecord(int k) const;
  void check(int j, Stage expected, const char* call) const;
  // The slot of gather `gen` of bucket j: the one another rank took for it,
  // else a free one taken now, else a new one.
  int slotFor(int j, uint64_t gen);
  const std::shared_ptr<ShmSegment>& mapSlot(int k);
  // Waits until ready(); `what` and `missing()` make the timeout message.
  template <typename Ready, typename Missing>
  void wait(Ready&& ready, Missing&& missing, const std::string& what);

  std::string name_;
  int party_;
  std::vector<int> party_ranks_;
  std::vector<size_t> bucket_bytes_;
  size_t slot_bytes_;
  int max_slots_;
  std::chrono::milliseconds timeout_;
  size_t record_stride_;
  size_t records_offset_;
  ShmSegment control_;
  std::vector<std::shared_ptr<ShmSegment>> slots_;  // slot k's memory, once mapped here
  std::vector<Local> local_;
};

}  // namespace hvdtorch
