#include "ops/reducescatter.h"

#include "common/error.h"
#include "ops/op_common.h"

namespace hvdtorch::ops {

int64_t reducescatter(Engine& engine, ReducescatterOptions opts) {
  const OpWhere where{engine, OpType::kReducescatter, opts.name};
  checkProcessSet(where, opts.process_set_id);
  if (opts.inputs.empty()) throw InvalidArgument(strCat(where.str(), ": needs at least one tensor"));
  if (!opts.allocate) throw InvalidArgument(strCat(where.str(), ": needs an output allocator"));
  auto e = std::make_shared<Entry>();
  Request& q = e->request;
  q.type = OpType::kReducescatter;
  q.process_set_id = opts.process_set_id;
  for (const auto& t : opts.inputs) {
    if (t->shape().empty()) throw InvalidArgument(strCat(where.str(), ": tensors need at least one dimension"));
    q.tensors.push_back(specOf(*t));
  }
  if (opts.op == ReduceOp::kAdasum)
    throw InvalidArgument(strCat(where.str(), ": Adasum has no reduce-scatter; use Sum, Average, Min, Max or Product"));
  ReduceArgs args = reduceArgs(where, opts.op, opts.prescale, opts.postscale, opts.inputs);
  args.fuse = false;
  q.args = args;
  q.name = std::move(opts.name);
  e->inputs = std::move(opts.inputs);
  e->allocate = std::move(opts.allocate);
  return engine.submit(std::move(e));
}

}  // namespace hvdtorch::ops
