// One gathered copy per host: the buckets of a sharded model (shard=3) that
// the local ranks of one host gather into shared memory and read in place,
// so that a host holds each gathered bucket once, not once per rank.
//
// Each local rank writes its own shard into the bucket's memory at its
// offset ("put"), and once every local rank has put its part ("await") the
// whole bucket is there for all of them, with no copy out: all-gathering a
// bucket among the ranks of one host is a copy of one's own shard and a
// barrier. When every local rank has released the bucket, the last one to
// do so hands its pages back to the system (MADV_REMOVE punches them out of
// the shared file), so the host's working set is the buckets some local
// rank is using, once.
//
// Generations. A bucket is gathered and released many times (forward,
// backward, after each step with new values). Every local rank counts its
// own gathers of each bucket; the n-th gather on one rank meets the n-th on
// the others, as the collectives they replace would (every rank gathers the
// same buckets in the same order: the caller's contract). Gather n of a
// bucket puts nothing before every local rank has released gather n - 1 and
// its pages are cleared: a rank still reading the old values (the previous
// backward) never sees the new ones being written.
//
// Memory layout. A control segment (created at construction by local rank
// 0, the others open it) holds, per bucket, the generation cleared last, a
// release count that picks the one rank that clears, and each local rank's
// last generation put and released (so that a timed-out wait names the
// ranks it waited for). Each bucket's memory is a segment of its own,
// created at its first gather: its pages are committed then (a full
// /dev/shm is an error then), re-committed at each later put
// (MADV_POPULATE_WRITE: a full /dev/shm is an error, not a SIGBUS). The
// segments follow ShmSegment's lifetime rules: nothing is left in /dev/shm
// once every local rank has mapped them, whatever happens after.
//
// Contract:
//  * Not thread-safe: one thread of each rank calls it (the Python thread
//    that runs forward and backward).
//  * put(j) then await(j) then release(j), in this order for each gather of
//    bucket j; put may be called with wait=false first (returns false when
//    the previous gather is not yet released everywhere: call it again,
//    with wait=true at the latest).
//  * The memory await() returns stays mapped while any copy of the
//    shared_ptr lives; after release() its contents are undefined (zeros,
//    or a later gather's values), never freed under a reader.
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

  // Writes `bytes` bytes from `src` at `offset` in bucket j for this rank's
  // next gather of it, once every local rank has released the previous
  // gather; false (nothing written yet) if `wait` is false and they have not.
  bool put(int j, const void* src, size_t offset, size_t bytes, bool wait);
  // Waits until every local rank has put its part of this gather of bucket j
  // and returns the bucket's memory (kept mapped by the shared_ptr).
  std::shared_ptr<char> await(int j);
  // This rank is done reading this gather of bucket j.
  void release(int j);

  int parties() const { return static_cast<int>(party_ranks_.size()); }
  size_t buckets() const { return bucket_bytes_.size(); }
  // Gathers of bucket j this rank has begun (for tests).
  uint64_t generation(int j) const { return local_[j].gen; }

 private:
  struct Record;
  enum class Stage { kIdle, kBegun, kPut, kHeld };
  struct Local {
    uint64_t gen = 0;  // gathers of the bucket this rank has begun
    Stage stage = Stage::kIdle;
  };
  Record record(int j) const;
  void check(int j, Stage expected, const char* call) const;
  void mapBucket(int j);
  // Waits until ready(); `what` and `missing()` make the timeout message.
  template <typename Ready, typename Missing>
  void wait(Ready&& ready, Missing&& missing, const std::string& what);

  std::string name_;
  int party_;
  std::vector<int> party_ranks_;
  std::vector<size_t> bucket_bytes_;
  std::chrono::milliseconds timeout_;
  size_t record_stride_;
  ShmSegment control_;
  std::vector<std::shared_ptr<ShmSegment>> data_;  // bucket j's memory, once mapped
  std::vector<Local> local_;
};

}  // namespace hvdtorch
