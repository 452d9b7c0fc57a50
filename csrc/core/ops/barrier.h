// Barrier: completes once every rank has submitted it.
#pragma once

#include <string>

#include "engine/engine.h"

namespace hvdtorch::ops {

struct BarrierOptions {
  static constexpr OpType kType = OpType::kBarrier;
  std::string name;
  int32_t process_set_id = 0;
};

int64_t barrier(Engine& engine, BarrierOptions opts);

// Its row's execute (engine/op_spec.h).
void executeBarrier(Executor& ex, WorkUnit& unit);

}  // namespace hvdtorch::ops
