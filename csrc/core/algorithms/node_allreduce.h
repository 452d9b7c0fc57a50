// 2-step node reducer ("node"): the hierarchical all-reduce of Tencent 2018 /
// BlueConnect / Horovod hierarchical, with the intra-host steps done through
// shared memory and parallel across the local ranks.
//
// For each chunk of at most slot_bytes:
//  1. intra-host reduce-scatter: every local rank copies its chunk into its
//     own slot of the node arena; barrier; local rank i then reduces slice i
//     (evenSplit of the chunk over local_size) of every local rank's slot
//     into slice i of its own slot. Every local rank reduces its own slice:
//     no single thread does the node's work.
//  2. cross-host: local rank i all-reduces its slice, in place in the arena,
//     with the same-local-rank ranks of the other hosts (topo.cross_ranks)
//     using the ring. Those peers are on other hosts, so Context::link picks
//     the remote transport. Skipped with one host.
//  3. intra-host all-gather: barrier; every local rank copies every slice
//     (slice j from local rank j's slot) out into its buffer.
// Step 1 is arenaReduceScatter (arena_reduce_scatter.h). The reducer also
// serves reduce-scatter with uneven blocks: rounds of step 1 alone, each
// local rank taking up to slot/local_size elements of a block, then copying
// its reduced part out (one barrier per round); across hosts, then the ring
// among the hosts (hasReduceScatter).
//
// Chunks (and reduce-scatter rounds) alternate between two buffer sets, so the copy-in of chunk k+1
// cannot overwrite what a slower rank is still copying out of chunk k (the
// first barrier of chunk k+2, which reuses the set, orders it). The
// alternation runs across calls for the same reason. Two barriers per chunk.
//
// Registered buffers (transport/shm/registered_memory.h): when this rank's data lies in a
// registered buffer, step 1 skips the copy-in (the rank publishes where the
// buffer is in its arena source record; peers reduce from it in place),
// local rank i reduces slice i straight in that buffer, and step 3 becomes
// "local rank i writes its reduced slice into every registered peer's
// buffer" -- no copy out. Ranks with plain buffers keep the copy path in the
// same round (a registered rank then also leaves its slice in its slot for
// them), so mixing both kinds is correct, only slower.
//
// The arena is created on the first call and reused ("register once"): its
// size is 2 x local_size x slot_bytes; any count works, larger ones are done
// in chunks. With one host this is a pure shared-memory all-reduce; with one
// rank per host it is the ring among the hosts.
//
// Needs a homogeneous topology (the same local_size on every host) so that
// slices line up across hosts; otherwise it falls back to the ring over all
// ranks. The intra-host phases always use shared memory, whatever link
// factories the Context has.
//
// Every barrier waits until ctx.deadline(): the operation's, which the
// engine sets once per unit (OperationDeadline), so a barrier that begins
// after a slow phase gets what is left, not a fresh timeout. After a
// failure the arena is released (peers fail fast) and the reducer refuses
// further calls: the ranks can no longer be in step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "algorithms/reducer.h"
#include "algorithms/ring_allreduce.h"

namespace hvdtorch {

class RegisteredMemory;
class ShmArena;

struct NodeOptions {
  // Job-unique segment prefix (makeShmPrefix); the arena of host h is
  // "<shm_prefix>-n<h>". Two NodeAllreduce alive at once in one job need
  // distinct prefixes.
  std::string shm_prefix;
  size_t slot_bytes = size_t(4) << 20;  // per local rank and buffer set
  RingOptions ring;                     // the cross-host phase
  // This process's registered buffers; null: every buffer takes the copy path.
  std::shared_ptr<RegisteredMemory> registered;
};

class NodeAllreduce : public Reducer {
 public:
  explicit NodeAllreduce(NodeOptions opts);
  ~NodeAllreduce() override;
  const char* name() const override { return "node"; }
  void allreduce(Context& ctx, void* data, size_t count, DataType dtype, ReduceOp op) override;
  // Copies in from `in` and out to `out` (through the slots; a registered
  // buffer is reduced in place only when in == out).
  void allreduceInto(Context& ctx, const void* in, void* out, size_t count, DataType dtype, ReduceOp op) override;
  // Hosts of as many ranks each, more than one: the reduce-scatter runs in
  // shared memory on the host, one round per host (local rank j reducing
  // the host's sum of the blocks of the ranks of local rank j), then each
  // rank reduce-scatters its column with the same local rank on the other
  // hosts over the ring: a host's link carries each block once, as the
  // hierarchical all-gather's (hierarchical_allgather.h).
  bool hasReduceScatter(const Context& ctx) const override;
  // Step 2's rings among the hosts, chunk after chunk: the slices of all
  // local ranks together are the whole buffer, so a host's link carries
  // 2(H-1)/H of it, whatever the local size.
  LinkTraffic linkTraffic(const Context& ctx) const override;
  // The cross-host ring's (ring_segment_bytes, ring_window) and the arena's slot size.
  std::map<std::string, int64_t> settings() const override;
  void reduceScatter(Context& ctx, void* data, const std::vector<size_t>& counts, DataType dtype, ReduceOp op) override;
  // Chunks this rank reduced in place in a registered buffer (no copy in or out).
  uint64_t inPlaceChunks() const { return in_place_chunks_; }

 private:
  ShmArena& arena(Context& ctx);
  void checkUsable(const Context& ctx, DataType dtype, ReduceOp op, size_t min_slot_elems) const;
  // Runs `body` and, if it fails after anything was shared, marks the
  // reducer broken (see above).
  template <typename Body>
  void guarded(Body&& body);
  // One chunk of at most a slot, from `in` into `out` (the same pointer: in place).
  void reduceChunk(Context& ctx, const char* in, char* out, size_t count, DataType dtype, ReduceOp op);

  NodeOptions opts_;
  RingAllreduce ring_;
  std::unique_ptr<ShmArena> arena_;
  int arena_rank_ = -1;  // the global rank the arena was made for
  uint64_t chunks_ = 0;  // chunks done in this arena; its parity picks the buffer set
  uint64_t in_place_chunks_ = 0;
  std::vector<char> scratch_;  // the reduce-scatter's column across hosts, packed
  std::string broken_;         // set after a failure: later calls throw it
};

}  // namespace hvdtorch
