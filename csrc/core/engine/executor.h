// Runs work units, in the order the controller planned them (the same on
// every rank), on the data-plane context. Completes or fails each entry.
#pragma once

#include "algorithms/reducer_set.h"
#include "engine/entry.h"
#include "engine/fusion.h"
#include "timeline/timeline.h"
#include "transport/context.h"

namespace hvdtorch {

class Executor {
 public:
  // `registered` (may be null): where the fusion buffer lives, so the node
  // reducer reduces fused units in place.
  Executor(Context& ctx, ReducerSet& reducers, Timeline& timeline,
           std::shared_ptr<RegisteredMemory> registered = nullptr)
      : ctx_(ctx), reducers_(reducers), timeline_(timeline), fusion_(std::move(registered)) {}

  // Runs one unit. Errors from the transport propagate (the engine then fails
  // everything: ranks may have diverged); errors carried by the unit itself
  // only fail its entries.
  void run(WorkUnit& unit);

 private:
  void allreduce(WorkUnit& unit);
  void allgather(WorkUnit& unit);
  void broadcast(WorkUnit& unit);
  void barrier(WorkUnit& unit);
  void join(WorkUnit& unit);
  void alltoall(WorkUnit& unit);
  void reducescatter(WorkUnit& unit);
  // Reduce-scatters tensors [first, last) of `e` (one dtype) into `outputs`
  // as one collective: the tensors are packed block-major in the fusion
  // buffer, block r holding rank r's rows of each.
  void reducescatterRun(Entry& e, const ReducescatterPlan& plan, size_t first, size_t last,
                        const std::vector<TensorPtr>& outputs);
  static void finishPiece(const WorkUnit::Piece& piece);
  // What the reducers run for `op`, and what the result is divided by.
  static ReduceOp reducedOp(ReduceOp op);
  int64_t averageDivisor(ReduceOp op) const;
  // Marks `phase` begun (or ended) for every op of the unit.
  void mark(const WorkUnit& unit, const std::string& phase, bool begin);

  Context& ctx_;
  ReducerSet& reducers_;
  Timeline& timeline_;
  FusionBuffer fusion_;
};

}  // namespace hvdtorch
