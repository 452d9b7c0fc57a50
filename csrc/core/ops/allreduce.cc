#include "ops/allreduce.h"

#include "algorithms/reducer_registry.h"
#include "common/error.h"
#include "device/reduce_kernels.h"
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

void executeAllreduce(Executor& ex, WorkUnit& unit) {
  const Request& req = unit.pieces.front().entry->request;
  const ReduceArgs& args = req.reduce();
  const DataType dtype = req.tensors[unit.pieces.front().tensor].dtype;
  size_t count = 0;
  for (const auto& p : unit.pieces) count += static_cast<size_t>(p.entry->request.tensors[p.tensor].numel());
  const ReduceOp op = Executor::reducedOp(args.op);
  const int64_t divisor = ex.averageDivisor(args.op);
  Reducer& reducer = ex.reducers().pick(args.reducer, ex.ctx(), count * dtypeSize(dtype), dtype, op);

  const std::string collective = strCat("ALLREDUCE:", reducer.name());
  if (unit.pieces.size() == 1) {
    // One tensor: reduce straight in the output, no fusion-buffer copies.
    const auto& p = unit.pieces.front();
    TensorBuffer& in = *p.entry->inputs[p.tensor];
    TensorBuffer& out = *p.entry->outputs[p.tensor];
    copyScaled(out.data(), in.data(), count, dtype, args.prescale);
    ex.mark(unit, collective, true);
    p.entry->state->times.reduce_begun = OpTimes::now();
    if (ex.ctx().size() > 1)
      ex.reducers().allreduce(ex.ctx(), reducer, out.data(), count, dtype, op);  // timed into `auto`'s model
    p.entry->state->times.reduce_ended = OpTimes::now();
    ex.mark(unit, collective, false);
    copyAveraged(out.data(), out.data(), count, dtype, divisor, args.postscale);
    Executor::finishPiece(p);
    return;
  }

  const size_t esize = dtypeSize(dtype);
  char* fused = static_cast<char*>(ex.fusion().reserve(count * esize));
  size_t off = 0;
  ex.mark(unit, "MEMCPY_IN_FUSION", true);
  for (const auto& p : unit.pieces) {
    TensorBuffer& in = *p.entry->inputs[p.tensor];
    const size_t n = static_cast<size_t>(in.numel());
    copyScaled(fused + off * esize, in.data(), n, dtype, args.prescale);
    off += n;
  }
  ex.mark(unit, "MEMCPY_IN_FUSION", false);
  ex.mark(unit, collective, true);
  if (ex.ctx().size() > 1)
    ex.reducers().allreduce(ex.ctx(), reducer, fused, count, dtype, op);  // timed into `auto`'s model
  ex.mark(unit, collective, false);
  ex.mark(unit, "MEMCPY_OUT_FUSION", true);
  off = 0;
  for (const auto& p : unit.pieces) {
    TensorBuffer& out = *p.entry->outputs[p.tensor];
    const size_t n = static_cast<size_t>(out.numel());
    copyAveraged(out.data(), fused + off * esize, n, dtype, divisor, args.postscale);
    off += n;
  }
  ex.mark(unit, "MEMCPY_OUT_FUSION", false);
  for (const auto& p : unit.pieces) Executor::finishPiece(p);
}

}  // namespace hvdtorch::ops
