#include "ops/join.h"

#include "common/error.h"
#include "ops/op_common.h"
#include "ops/op_table.h"

namespace hvdtorch::ops {

int64_t join(Engine& engine, JoinOptions opts) {
  return OpEntry(engine, JoinOptions::kType, opts.name).submit({}, {}, std::move(opts.allocate));
}

void executeJoin(Executor& ex, WorkUnit& unit) {
  // Nothing moves: negotiation already made every rank wait for the last one.
  Entry& e = *unit.pieces.front().entry;
  TensorPtr out = e.allocate(DataType::kInt32, {});
  *static_cast<int32_t*>(out->data()) = std::get<JoinPlan>(unit.plan).last_rank;
  e.outputs = {std::move(out)};
  ex.complete(e);
}

// Its row of the op table (engine/op_spec.h says what each column means).
const OpSpec& joinRow() {
  static const OpSpec row = {OpType::kJoin,
                             "join",
                             argsIndex<NoArgs>(),
                             planIndex<JoinPlan>(),
                             /*first_dim_free=*/false,
                             /*cacheable=*/false,
                             /*fuses=*/false,
                             InlineRun::kAlways,
                             WhileJoined::kIsJoin,
                             Outputs::kAllocated,
                             Staging::kByExecutor,
                             /*make_plan=*/nullptr,
                             /*execute=*/executeJoin};
  return row;
}

}  // namespace hvdtorch::ops
