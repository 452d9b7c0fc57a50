#include "ops/join.h"

#include "common/error.h"
#include "ops/op_common.h"

namespace hvdtorch::ops {

int64_t join(Engine& engine, JoinOptions opts) {
  const OpWhere where{engine, OpType::kJoin, opts.name};
  if (!opts.allocate) throw InvalidArgument(strCat(where.str(), ": needs an output allocator"));
  auto e = std::make_shared<Entry>();
  e->request.type = OpType::kJoin;
  e->request.name = std::move(opts.name);
  e->allocate = std::move(opts.allocate);
  return engine.submit(std::move(e));
}

void executeJoin(Executor& ex, WorkUnit& unit) {
  // Nothing moves: negotiation already made every rank wait for the last one.
  Entry& e = *unit.pieces.front().entry;
  TensorPtr out = e.allocate(DataType::kInt32, {});
  *static_cast<int32_t*>(out->data()) = std::get<JoinPlan>(unit.plan).last_rank;
  e.outputs = {std::move(out)};
  ex.complete(e);
}

}  // namespace hvdtorch::ops
