// Broadcast of the root rank's tensor into every rank's output.
#pragma once

#include <string>
#include <tuple>

#include "engine/engine.h"
#include "ops/option_fields.h"

namespace hvdtorch::ops {

struct BroadcastOptions {
  static constexpr OpType kType = OpType::kBroadcast;
  std::string name;
  TensorPtr input;
  TensorPtr output;  // same dtype and size; may alias the input (in place)
  int root = 0;
  int32_t process_set_id = 0;
  // Its plain fields, which the Python binding sets by name (ops/option_fields.h).
  static constexpr auto fields() {
    return std::make_tuple(field("name", &BroadcastOptions::name), field("root", &BroadcastOptions::root),
                           field("process_set_id", &BroadcastOptions::process_set_id));
  }
};

int64_t broadcast(Engine& engine, BroadcastOptions opts);

// Its row's execute (engine/op_spec.h).
void executeBroadcast(Executor& ex, WorkUnit& unit);

}  // namespace hvdtorch::ops
