#include "ops/barrier.h"

#include "ops/op_common.h"

namespace hvdtorch::ops {

int64_t barrier(Engine& engine, BarrierOptions opts) {
  checkProcessSet(OpWhere{engine, OpType::kBarrier, opts.name}, opts.process_set_id);
  auto e = std::make_shared<Entry>();
  e->request.type = OpType::kBarrier;
  e->request.process_set_id = opts.process_set_id;
  e->request.name = std::move(opts.name);
  return engine.submit(std::move(e));
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
