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

}  // namespace hvdtorch::ops
