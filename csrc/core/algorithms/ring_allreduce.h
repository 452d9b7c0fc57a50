// 1-step ring all-reduce (Patarasuk & Yuan 2009): a reduce-scatter followed by
// an all-gather, p-1 steps each, every rank sending 2(p-1)/p of the buffer.
// The reduce-scatter phase alone is the ring reduce-scatter, with blocks of
// any size per rank (reduceScatter, reduceScatterAmong).
//
// Schedule: the buffer is cut into p blocks, block i being the one ring
// position i owns at the end of the reduce-scatter. At step s (0 <= s <
// 2(p-1)) position `pos` receives block (pos - s - 2) mod p from its left
// neighbour: reduced into place during the first p-1 steps (it ends with its
// own block fully reduced at step p-2), copied into place during the last p-1.
// What a rank sends at step s+1 is what it received at step s, so every
// block travels once round the ring per phase.
//
// Pipelining: each block is cut into segments of at most `segment_bytes`.
// Up to `window` receives are outstanding at once, and a segment is forwarded
// to the right neighbour the moment it has been reduced, so the reduction of
// one segment overlaps the transfer of the next ones and consecutive ring
// steps (and the two phases) overlap too.
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
  bool hasReduceScatter(const Context&) const override { return true; }
  LinkTraffic linkTraffic(const Context& ctx) const override;
  std::map<std::string, int64_t> settings() const override {
    return {{"segment_bytes", static_cast<int64_t>(opts_.segment_bytes)}, {"window", opts_.window}};
  }
  void reduceScatter(Context& ctx, void* data, const std::vector<size_t>& counts, DataType dtype, ReduceOp op) override;

  // All-reduce among `members` only (global ranks, ring order; must contain
  // ctx.rank()). `data` is reduced element-wise across those ranks.
  void allreduceAmong(Context& ctx, const std::vector<int>& members, void* data, size_t count, DataType dtype,
                      ReduceOp op);
  // Reduce-scatter among `members`: on return, the element range blocks[i]
  // of `data` on ring position i holds the reduction of that range over every
  // member. The blocks tile a prefix of the buffer in any order and may be
  // empty; every member passes the same blocks.
  void reduceScatterAmong(Context& ctx, const std::vector<int>& members, void* data, const std::vector<Range>& blocks,
                          DataType dtype, ReduceOp op);

 private:
  // The ring schedule over `blocks`: the reduce-scatter steps and, when
  // `allgather` is set, the all-gather steps after them.
  void run(Context& ctx, const std::vector<int>& members, void* data, const std::vector<Range>& blocks, DataType dtype,
           ReduceOp op, bool allgather);

  RingOptions opts_;
  std::vector<char> scratch_;  // persistent receive slots, grown on demand
};

}  // namespace hvdtorch
