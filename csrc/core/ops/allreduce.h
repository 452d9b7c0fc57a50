// All-reduce of one tensor, or of a group negotiated and fused as one unit
// (grouped_allreduce).
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "engine/engine.h"
#include "ops/option_fields.h"

namespace hvdtorch::ops {

struct AllreduceOptions {
  static constexpr OpType kType = OpType::kAllreduce;
  std::string name;
  std::vector<TensorPtr> inputs;
  // One per input, same dtype and element count; may alias the inputs (in place).
  std::vector<TensorPtr> outputs;
  ReduceOp op = ReduceOp::kAverage;
  double prescale = 1.0;
  double postscale = 1.0;
  // A registered reducer, "auto", or "" for the configured default (HVDTORCH_REDUCER).
  std::string reducer;
  bool fuse = true;  // false: never packed with other ops in a fusion buffer
  int32_t process_set_id = 0;
  // Its plain fields, which the Python binding sets by name (ops/option_fields.h).
  static constexpr auto fields() {
    return std::make_tuple(field("name", &AllreduceOptions::name), field("op", &AllreduceOptions::op),
                           field("prescale", &AllreduceOptions::prescale),
                           field("postscale", &AllreduceOptions::postscale),
                           field("reducer", &AllreduceOptions::reducer), field("fuse", &AllreduceOptions::fuse),
                           field("process_set_id", &AllreduceOptions::process_set_id));
  }
};

// What `opts` asks the engine to do, checked (InvalidArgument naming the
// rank, op and what is wrong): the reduce policy of op_common.h, then the
// reducer, which must serve every input's dtype with that op here. Asking
// for a reducer that defines its own op (adasum) by name makes a Sum or
// Average that op; Adasum is never fused (its dot products are per tensor).
// `auto` for tensors in registered memory reduced in place becomes the
// registered reducer here (ReducerSet::forRequest), so that every rank
// negotiates the same one.
ReduceArgs allreduceArgs(const Engine& engine, const AllreduceOptions& opts);

// Checks everything that can be checked locally (nothing is sent when it
// throws), builds the request and submits it; returns the handle.
int64_t allreduce(Engine& engine, AllreduceOptions opts);

// Its row's execute (engine/op_spec.h). Device tensors of a set of one rank
// never leave their device (only reducer="native" still calls the backend).
void executeAllreduce(Executor& ex, WorkUnit& unit);

// All-reduce units of device tensors this process ran at one rank, on the
// device (for tests).
uint64_t oneRankDeviceAllreduces();

}  // namespace hvdtorch::ops
