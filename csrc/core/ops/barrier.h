// Barrier: completes once every rank has submitted it.
#pragma once

#include <string>
#include <tuple>

#include "engine/engine.h"
#include "ops/option_fields.h"

namespace hvdtorch::ops {

struct BarrierOptions {
  static constexpr OpType kType = OpType::kBarrier;
  std::string name;
  int32_t process_set_id = 0;
  // Its plain fields, which the Python binding sets by name (ops/option_fields.h).
  static constexpr auto fields() {
    return std::make_tuple(field("name", &BarrierOptions::name),
                           field("process_set_id", &BarrierOptions::process_set_id));
  }
};

int64_t barrier(Engine& engine, BarrierOptions opts);

// Its row's execute (engine/op_spec.h).
void executeBarrier(Executor& ex, WorkUnit& unit);

}  // namespace hvdtorch::ops
