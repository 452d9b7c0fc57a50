#include "ops/barrier.h"

#include "ops/op_common.h"
#include "ops/op_table.h"

namespace hvdtorch::ops {

int64_t barrier(Engine& engine, BarrierOptions opts) {
  return OpEntry(engine, BarrierOptions::kType, opts.name, opts.process_set_id).submit({});
}

void executeBarrier(Executor& ex, WorkUnit& unit) {
  if (ex.ctx().native() != nullptr) {
    ex.ctx().native()->barrier();
  } else {
    int32_t token = 0;
    ex.router()
        .reducers()
        .resolve(kAutoReducer, ex.ctx(), sizeof token, DataType::kInt32, ReduceOp::kSum)
        .allreduce(ex.ctx(), &token, 1, DataType::kInt32, ReduceOp::kSum);
  }
  ex.complete(*unit.pieces.front().entry);
}

// Its row of the op table (engine/op_spec.h says what each column means).
const OpSpec& barrierRow() {
  static const OpSpec row = {
      OpType::kBarrier,          "barrier",          argsIndex<NoArgs>(),     planIndex<NoPlan>(),
      /*first_dim_free=*/false,
      /*cacheable=*/true,
      /*fuses=*/false,           InlineRun::kAlways, WhileJoined::kTakesPart, Outputs::kNone,      Staging::kByExecutor,
      /*make_plan=*/nullptr,
      /*execute=*/executeBarrier};
  return row;
}

}  // namespace hvdtorch::ops
