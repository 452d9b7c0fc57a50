#include "algorithms/node_allreduce.h"

#include <algorithm>
#include <cstring>

#include "algorithms/reduce_kernels.h"
#include "common/error.h"
#include "transport/shm_arena.h"

namespace hvdtorch {

NodeAllreduce::NodeAllreduce(NodeOptions opts) : opts_(std::move(opts)), ring_(opts_.ring) {}

NodeAllreduce::~NodeAllreduce() = default;

ShmArena& NodeAllreduce::arena(Context& ctx) {
  const Topology& t = ctx.topo();
  if (arena_) {
    if (arena_rank_ != t.rank || arena_->localSize() != t.local_size || arena_->localRank() != t.local_rank)
      throw InvalidArgument(strCat("rank ", t.rank, ": node reducer reused with a different topology; "
                                   "make one NodeAllreduce per Context"));
    return *arena_;
  }
  const std::string name = strCat(opts_.shm_prefix, "-n", t.host_of_rank[t.rank]);
  arena_ = std::make_unique<ShmArena>(name, t.local_rank, t.local_ranks, opts_.slot_bytes, ctx.deadline());
  arena_rank_ = t.rank;
  return *arena_;
}

void NodeAllreduce::allreduce(Context& ctx, void* data, size_t count, DataType dtype, ReduceOp op) {
  const Topology& t = ctx.topo();
  if (count == 0 || t.size == 1) return;
  if (op != ReduceOp::kSum && op != ReduceOp::kMin && op != ReduceOp::kMax && op != ReduceOp::kProduct)
    throw InvalidArgument(strCat("node reducer: op ", reduceOpName(op), " is not an element-wise reduction"));
  if (!broken_.empty()) throw CollectiveError(broken_);
  if (!t.homogeneous()) {
    // Slices would not line up across hosts of different local_size.
    ring_.allreduce(ctx, data, count, dtype, op);
    return;
  }
  if (t.local_size == 1) {
    ring_.allreduceAmong(ctx, t.cross_ranks, data, count, dtype, op);
    return;
  }
  const size_t esize = dtypeSize(dtype);
  const size_t chunk = opts_.slot_bytes / esize;
  if (chunk == 0)
    throw InvalidArgument(strCat("node reducer: slot of ", opts_.slot_bytes, " bytes is smaller than one ",
                                 dtypeName(dtype), " element"));
  try {
    char* base = static_cast<char*>(data);
    for (size_t done = 0; done < count; done += chunk)
      reduceChunk(ctx, base + done * esize, std::min(chunk, count - done), dtype, op);
  } catch (const InvalidArgument&) {
    throw;  // raised before anything was shared: the ranks are still in step
  } catch (const std::exception& e) {
    // Barrier counts no longer agree across local ranks. Releasing the arena
    // now makes the peers' waits fail fast instead of timing out.
    broken_ = strCat("node reducer unusable after an earlier failure: ", e.what());
    arena_.reset();
    throw;
  }
}

void NodeAllreduce::reduceChunk(Context& ctx, char* data, size_t count, DataType dtype, ReduceOp op) {
  const Topology& t = ctx.topo();
  ShmArena& a = arena(ctx);
  const size_t esize = dtypeSize(dtype);
  const int me = t.local_rank;
  const int local = t.local_size;
  const int set = static_cast<int>(chunks_++ % 2);
  char* mine = a.slot(set, me);

  // 1. Reduce-scatter inside the host: my slice of every local rank's slot
  //    into my own slot (nobody else reads my slice before the next barrier).
  std::memcpy(mine, data, count * esize);
  a.barrier(ctx.deadline(), "after copy-in");
  const Range s = evenSplit(count, local, me);
  const size_t at = s.offset * esize;
  for (int j = 0; j < local; ++j)
    if (j != me) reduceInto(mine + at, a.slot(set, j) + at, s.count, dtype, op);

  // 2. Across hosts, among the ranks holding the same slice.
  if (t.cross_size > 1) ring_.allreduceAmong(ctx, t.cross_ranks, mine + at, s.count, dtype, op);

  // 3. All-gather inside the host: every slice from its owner's slot.
  a.barrier(ctx.deadline(), "after reduce");
  for (int j = 0; j < local; ++j) {
    const Range r = evenSplit(count, local, j);
    std::memcpy(data + r.offset * esize, a.slot(set, j) + r.offset * esize, r.count * esize);
  }
}

}  // namespace hvdtorch
