// 1-step ring all-reduce (Patarasuk & Yuan 2009): a reduce-scatter followed by
// an all-gather, p-1 steps each, every rank sending 2(p-1)/p of the buffer.
//
// Pipelining: each chunk is cut into segments of at most `segment_bytes`.
// Up to `window` receives are outstanding at once, and a segment is forwarded
// to the right neighbour the moment it has been reduced, so the reduction of
// one segment overlaps the transfer of the next ones and consecutive ring
// steps overlap too.
//
// The ring can run over any subset of ranks (`members`, in ring order), which
// is how the node reducer runs its cross-host phase.
#pragma once

#include <vector>

#include "algorithms/reducer.h"

namespace hvdtorch {

struct RingOptions {
  size_t segment_bytes = 1 << 20;
  int window = 4;
};

class RingAllreduce : public Reducer {
 public:
  explicit RingAllreduce(RingOptions opts = {}) : opts_(opts) {}
  const char* name() const override { return "ring"; }
  void allreduce(Context& ctx, void* data, size_t count, DataType dtype, ReduceOp op) override;

  // All-reduce among `members` only (global ranks, ring order; must contain
  // ctx.rank()). `data` is reduced element-wise across those ranks.
  void allreduceAmong(Context& ctx, const std::vector<int>& members, void* data, size_t count,
                      DataType dtype, ReduceOp op);

 private:
  RingOptions opts_;
  std::vector<char> scratch_;  // persistent receive slots, grown on demand
};

}  // namespace hvdtorch
