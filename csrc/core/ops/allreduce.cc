#include "ops/allreduce.h"

#include "algorithms/reducer_registry.h"
#include "common/error.h"
#include "ops/op_common.h"

namespace hvdtorch::ops {

ReduceArgs allreduceArgs(const Engine& engine, const AllreduceOptions& opts) {
  const OpWhere where{engine, OpType::kAllreduce, opts.name};
  ReduceArgs args = reduceArgs(where, opts.op, opts.prescale, opts.postscale, opts.inputs);
  try {
    args.reducer = parseReducer(opts.reducer.empty() ? engine.config().reducer : opts.reducer);
    // A reducer that defines its own op (Adasum) makes a Sum or Average that op.
    if (args.reducer != kAutoReducer) {
      const auto& own = reducerRegistry()[args.reducer].own_op;
      if (own && (args.op == ReduceOp::kSum || args.op == ReduceOp::kAverage)) args.op = *own;
    }
    // The reducers run Average as a Sum.
    const ReduceOp reduced = args.op == ReduceOp::kAverage ? ReduceOp::kSum : args.op;
    const auto ps = engine.processSet(opts.process_set_id);
    const ReducerSet& reducers = ps && ps->member() ? *ps->reducers : engine.reducers();
    const Context& ctx = ps && ps->member() ? *ps->data : engine.dataContext();
    for (const auto& t : opts.inputs) reducers.check(args.reducer, ctx, t->dtype(), reduced);
  } catch (const InvalidArgument& err) {
    throw InvalidArgument(strCat(where.str(), ": ", err.what()));
  }
  // Adasum's dot products are per tensor: never fuse it with other tensors.
  args.fuse = opts.fuse && args.op != ReduceOp::kAdasum;
  return args;
}

int64_t allreduce(Engine& engine, AllreduceOptions opts) {
  const OpWhere where{engine, OpType::kAllreduce, opts.name};
  checkProcessSet(where, opts.process_set_id);
  if (opts.inputs.empty() || opts.inputs.size() != opts.outputs.size())
    throw InvalidArgument(strCat(where.str(), ": needs as many outputs as inputs, and at least one"));
  auto e = std::make_shared<Entry>();
  Request& q = e->request;
  q.type = OpType::kAllreduce;
  q.process_set_id = opts.process_set_id;
  q.tensors.reserve(opts.inputs.size());
  for (size_t i = 0; i < opts.inputs.size(); ++i) {
    const TensorBuffer& in = *opts.inputs[i];
    const TensorBuffer& out = *opts.outputs[i];
    if (in.numel() != out.numel() || in.dtype() != out.dtype())
      throw InvalidArgument(strCat(where.str(), ": output ", i, " does not match its input"));
    q.tensors.push_back(specOf(in));
  }
  q.args = allreduceArgs(engine, opts);
  q.name = std::move(opts.name);
  e->inputs = std::move(opts.inputs);
  e->outputs = std::move(opts.outputs);
  return engine.submit(std::move(e));
}

}  // namespace hvdtorch::ops
