#include "ops/barrier.h"

#include "ops/op_common.h"

namespace hvdtorch::ops {

int64_t barrier(Engine& engine, BarrierOptions opts) {
  return OpEntry(engine, BarrierOptions::kType, opts.name, opts.process_set_id).submit({});
}

void executeBarrier(Executor& ex, WorkUnit& unit) {
  if (ex.ctx().native() != nullptr) {
    ex.ctx().native()->barrier();
  } else {
    int32_t token = 0;
    ex.reducers()
        .resolve(kAutoReducer, ex.ctx(), sizeof token, DataType::kInt32, ReduceOp::kSum)
        .allreduce(ex.ctx(), &token, 1, DataType::kInt32, ReduceOp::kSum);
  }
  ex.complete(*unit.pieces.front().entry);
}

}  // namespace hvdtorch::ops
