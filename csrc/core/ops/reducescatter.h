// Reduce-scatter: the reduction over ranks of each tensor, of which rank r
// keeps its share of rows of dimension 0 -- dim0 / size rows, one more for
// the first dim0 % size ranks (Horovod's split). A group
// (grouped_reducescatter) is negotiated as one unit, and tensors of one
// dtype in it run as one collective.
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include "engine/engine.h"
#include "ops/option_fields.h"

namespace hvdtorch::ops {

struct ReducescatterOptions {
  static constexpr OpType kType = OpType::kReducescatter;
  std::string name;
  std::vector<TensorPtr> inputs;  // at least one dimension each; not modified
  OutputAllocator allocate;       // makes each output (its share of the rows)
  ReduceOp op = ReduceOp::kAverage;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t process_set_id = 0;
  // Its plain fields, which the Python binding sets by name (ops/option_fields.h).
  static constexpr auto fields() {
    return std::make_tuple(field("name", &ReducescatterOptions::name), field("op", &ReducescatterOptions::op),
                           field("prescale", &ReducescatterOptions::prescale),
                           field("postscale", &ReducescatterOptions::postscale),
                           field("process_set_id", &ReducescatterOptions::process_set_id));
  }
};

int64_t reducescatter(Engine& engine, ReducescatterOptions opts);

// Rows of dimension 0 rank `rank` of `size` keeps.
int64_t reducescatterRows(int64_t dim0, int size, int rank);

// Its row's make_plan (engine/op_spec.h).
OpPlan planReducescatter(const std::vector<const Request*>& by_rank);
// Its row's execute (engine/op_spec.h).
void executeReducescatter(Executor& ex, WorkUnit& unit);

}  // namespace hvdtorch::ops
