// Reduce to one root: the reduction over ranks of one tensor, which the root
// rank gets in its output; every other rank's output is its own input,
// unchanged (torch.distributed.reduce's semantics, where a non-root's tensor
// is left as it was). First implementation: an all-reduce of a copy of the
// input, kept by the root only, so it costs what an all-reduce costs; device
// tensors are staged through host memory.
#pragma once

#include <string>
#include <tuple>

#include "engine/engine.h"
#include "ops/option_fields.h"

namespace hvdtorch::ops {

struct ReduceOptions {
  static constexpr OpType kType = OpType::kReduce;
  std::string name;
  TensorPtr input;   // not modified (unless it is also the output)
  TensorPtr output;  // same dtype and size; may alias the input (in place)
  int root = 0;      // a global rank, which must be in the process set (as broadcast's)
  ReduceOp op = ReduceOp::kAverage;
  int32_t process_set_id = 0;
  // Its plain fields, which the Python binding sets by name (ops/option_fields.h).
  static constexpr auto fields() {
    return std::make_tuple(field("name", &ReduceOptions::name), field("root", &ReduceOptions::root),
                           field("op", &ReduceOptions::op), field("process_set_id", &ReduceOptions::process_set_id));
  }
};

// Checks everything that can be checked locally (the root, the output, the
// reduce policy of op_common.h, a reducer serving the dtype and op; nothing
// is sent when it throws), builds the request and submits it.
int64_t reduce(Engine& engine, ReduceOptions opts);

// Its row's execute (engine/op_spec.h).
void executeReduce(Executor& ex, WorkUnit& unit);

}  // namespace hvdtorch::ops
