// All-gather: every rank's tensor concatenated along dimension 0, which may
// differ across ranks; a group (grouped_allgather) is negotiated as one unit.
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include "engine/engine.h"
#include "ops/option_fields.h"

namespace hvdtorch::ops {

struct AllgatherOptions {
  static constexpr OpType kType = OpType::kAllgather;
  std::string name;
  std::vector<TensorPtr> inputs;  // at least one dimension each
  OutputAllocator allocate;       // makes each output once every rank's size is known
  int32_t process_set_id = 0;
  // Its plain fields, which the Python binding sets by name (ops/option_fields.h).
  static constexpr auto fields() {
    return std::make_tuple(field("name", &AllgatherOptions::name),
                           field("process_set_id", &AllgatherOptions::process_set_id));
  }
};

int64_t allgather(Engine& engine, AllgatherOptions opts);

// Its row's make_plan (engine/op_spec.h).
OpPlan planAllgather(const std::vector<const Request*>& by_rank);
// Its row's execute (engine/op_spec.h).
void executeAllgather(Executor& ex, WorkUnit& unit);

}  // namespace hvdtorch::ops
