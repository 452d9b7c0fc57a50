// Runs work units, in the order the controller planned them (the same on
// every rank), on the data-plane context. Completes or fails each entry.
//
// What a unit does is its op's: run() calls the execute function of the op's
// row (engine/op_spec.h; each op's in ops/<op>.cc), which uses the context,
// reducers, fusion buffer and timeline marks below.
//
// Device tensors: for a row with Staging::kByExecutor, run() swaps a device
// entry's buffers for pinned host copies before execute (host_staging.h),
// and complete() copies the outputs back before the op completes, so an
// op's execute function only ever sees host memory. The all-reduce
// (kByOp) stages its pieces through the fusion buffer itself.
#pragma once

#include "algorithms/reducer_set.h"
#include "engine/entry.h"
#include "engine/fusion.h"
#include "engine/host_staging.h"
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

  // ---- for the ops' execute functions (on the executor's thread only) ----
  Context& ctx() { return ctx_; }
  ReducerSet& reducers() { return reducers_; }
  FusionBuffer& fusion() { return fusion_; }
  // Completes the piece's entry when it was the entry's last piece.
  void finishPiece(const WorkUnit::Piece& piece);
  // Completes the entry with its outputs (copied back to the device first
  // when the executor staged it). Every execute function finishes its
  // entries through this or finishPiece.
  void complete(Entry& entry);
  // Pinned host memory for this unit (valid until run() returns).
  StagingPool& staging() { return staging_; }

  // What the reducers run for `op`, and what the result is divided by.
  static ReduceOp reducedOp(ReduceOp op);
  int64_t averageDivisor(ReduceOp op) const;
  // Marks `phase` begun (or ended) for every op of the unit.
  void mark(const WorkUnit& unit, const std::string& phase, bool begin);

 private:
  Context& ctx_;
  ReducerSet& reducers_;
  Timeline& timeline_;
  FusionBuffer fusion_;
  StagingPool staging_;
};

// Elements of one row (everything but dimension 0) of `shape`.
size_t rowElems(const std::vector<int64_t>& shape);

}  // namespace hvdtorch
