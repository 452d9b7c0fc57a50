#include "ops/allgather.h"

#include "algorithms/ring_allgather.h"
#include "common/error.h"
#include "ops/op_common.h"

namespace hvdtorch::ops {

int64_t allgather(Engine& engine, AllgatherOptions opts) {
  const OpWhere where{engine, OpType::kAllgather, opts.name};
  checkProcessSet(where, opts.process_set_id);
  if (opts.inputs.empty()) throw InvalidArgument(strCat(where.str(), ": needs at least one tensor"));
  if (!opts.allocate) throw InvalidArgument(strCat(where.str(), ": needs an output allocator"));
  checkOneDevice(where, opts.inputs);
  auto e = std::make_shared<Entry>();
  Request& q = e->request;
  q.type = OpType::kAllgather;
  q.process_set_id = opts.process_set_id;
  for (const auto& t : opts.inputs) {
    if (t->shape().empty()) throw InvalidArgument(strCat(where.str(), ": tensors need at least one dimension"));
    q.tensors.push_back(specOf(*t));
  }
  q.name = std::move(opts.name);
  e->inputs = std::move(opts.inputs);
  e->allocate = std::move(opts.allocate);
  return engine.submit(std::move(e));
}

OpPlan planAllgather(const std::vector<const Request*>& by_rank) {
  const int p = static_cast<int>(by_rank.size());
  AllgatherPlan plan;
  for (int r = 0; r < p; ++r)
    for (const auto& t : by_rank[r]->tensors) plan.first_dims.push_back(t.shape.empty() ? 1 : t.shape[0]);
  return plan;
}

void executeAllgather(Executor& ex, WorkUnit& unit) {
  Entry& e = *unit.pieces.front().entry;
  const AllgatherPlan& plan = std::get<AllgatherPlan>(unit.plan);
  const size_t n = e.inputs.size();
  const int p = ex.ctx().size();
  std::vector<TensorPtr> outs;
  ex.mark(unit, "ALLGATHER", true);
  for (size_t t = 0; t < n; ++t) {
    TensorBuffer& in = *e.inputs[t];
    std::vector<int64_t> shape = in.shape();
    const size_t row_bytes = rowElems(shape) * dtypeSize(in.dtype());
    std::vector<size_t> bytes(p);
    int64_t total_rows = 0;
    for (int r = 0; r < p; ++r) {
      const int64_t rows = plan.first_dims[r * n + t];
      bytes[r] = static_cast<size_t>(rows) * row_bytes;
      total_rows += rows;
    }
    shape[0] = total_rows;
    outs.push_back(e.allocate(in.dtype(), shape));
    ringAllgatherv(ex.ctx(), in.data(), outs.back()->data(), bytes);
  }
  ex.mark(unit, "ALLGATHER", false);
  e.outputs = std::move(outs);
  ex.complete(e);
}

}  // namespace hvdtorch::ops
