#include "ops/reduce.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "device/reduce_kernels.h"
#include "ops/op_common.h"
#include "ops/op_table.h"

namespace hvdtorch::ops {

int64_t reduce(Engine& engine, ReduceOptions opts) {
  OpEntry op(engine, ReduceOptions::kType, opts.name, opts.process_set_id);
  const int32_t set_root = op.rootInSet(opts.root);
  op.outputLikeInput(*opts.input, *opts.output);
  if (opts.op == ReduceOp::kAdasum) op.fail("Adasum has no reduce; use Sum, Average, Min, Max or Product");
  ReduceToRootArgs args{reduceArgs(op.where(), opts.op, 1.0, 1.0, {opts.input}), set_root};
  args.reduce.fuse = false;
  // It runs on the reducer `auto` picks (execute), which must serve the dtype and op here.
  const ProcessSet& ps = op.processSet();
  try {
    ps.router->reducers().check(kAutoReducer, *ps.data, opts.input->dtype(), Executor::reducedOp(opts.op));
  } catch (const InvalidArgument& err) {
    op.fail(err.what());
  }
  return op.submit({std::move(opts.input)}, {std::move(opts.output)}, nullptr, args);
}

// Host memory only (Staging::kByExecutor in its row). Every rank reduces a
// prescaled copy of its input in the fusion buffer (the same kind of buffer
// on every rank, as the reducers expect of a unit); the root copies the
// result out, averaged and postscaled, and every other rank's output is its
// input.
void executeReduce(Executor& ex, WorkUnit& unit) {
  Entry& e = *unit.pieces.front().entry;
  const ReduceToRootArgs& args = e.request.payload<ReduceToRootArgs>();
  TensorBuffer& in = *e.inputs[0];
  TensorBuffer& out = *e.outputs[0];
  const DataType dtype = in.dtype();
  const size_t count = static_cast<size_t>(in.numel());
  const ReduceOp op = Executor::reducedOp(args.reduce.op);
  void* work = ex.fusion().reserve(std::max<size_t>(1, in.bytes()));
  copyScaled(work, in.data(), count, dtype, args.reduce.prescale);
  AllreduceQuery query;
  query.asked = args.reduce.reducer;
  query.dtype = dtype;
  query.op = op;
  query.bytes = in.bytes();
  Reducer& reducer = *ex.router().route(query).host;
  ex.reduceOnHost(unit, reducer, work, count, dtype, op, &e.state->times);
  if (ex.ctx().rank() == args.root) {
    copyAveraged(out.data(), work, count, dtype, ex.averageDivisor(args.reduce.op), args.reduce.postscale);
  } else if (out.data() != in.data()) {
    std::memcpy(out.data(), in.data(), in.bytes());
  }
  ex.complete(e);
}

// Its row of the op table (engine/op_spec.h says what each column means).
const OpSpec& reduceRow() {
  static const OpSpec row = {
      OpType::kReduce,          "reduce",          argsIndex<ReduceToRootArgs>(), planIndex<NoPlan>(),
      /*first_dim_free=*/false,
      /*cacheable=*/true,
      /*fuses=*/false,          InlineRun::kNever, WhileJoined::kAddsZeros,       Outputs::kLikeInputs,
      Staging::kByExecutor,
      /*make_plan=*/nullptr,
      /*execute=*/executeReduce};
  return row;
}

}  // namespace hvdtorch::ops
