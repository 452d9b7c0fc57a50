#include "ops/allreduce.h"

#include "common/error.h"
#include "ops/op_common.h"

namespace hvdtorch::ops {

ReduceArgs allreduceArgs(const Engine& engine, const AllreduceOptions& opts) {
  const OpWhere where{engine, OpType::kAllreduce, opts.name};
  ReduceArgs args = reduceArgs(where, opts.op, opts.prescale, opts.postscale, opts.inputs);
  try {
    args.reducer = parseReducer(opts.reducer.empty() ? engine.config().reducer : opts.reducer);
    // The reducers run Average as a Sum.
    const ReduceOp reduced = args.op == ReduceOp::kAverage ? ReduceOp::kSum : args.op;
    for (const auto& t : opts.inputs) engine.reducers().check(args.reducer, engine.dataContext(), t->dtype(), reduced);
  } catch (const InvalidArgument& err) {
    throw InvalidArgument(strCat(where.str(), ": ", err.what()));
  }
  args.fuse = opts.fuse;
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
