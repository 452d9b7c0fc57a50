// Requests as the tests build them by hand: one float32 tensor and the op's
// payload at its defaults (the op table says which payload), to be adjusted
// by the test where it matters.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/request.h"
#include "ops/op_table.h"

namespace hvdtorch::test {

// Tests build and read requests without an Engine, which would otherwise
// hand ops' table to the engine (engine/op_spec.h): every test binary that
// includes this header uses ops' table from the start.
[[maybe_unused]] inline const bool kOpTableInUse = (useOpTable(ops::opTable()), true);

template <size_t... I>
OpArgs defaultArgs(size_t index, std::index_sequence<I...>) {
  OpArgs args;
  ((index == I ? (void)(args = std::variant_alternative_t<I, OpArgs>{}) : (void)0), ...);
  return args;
}

// An op of `type` named `name` over one float32 tensor of `shape`.
inline Request request(OpType type, const std::string& name, std::vector<int64_t> shape = {4}) {
  Request q;
  q.type = type;
  q.name = name;
  q.tensors = {{DataType::kFloat32, std::move(shape)}};
  q.args = defaultArgs(opSpec(type).args, std::make_index_sequence<std::variant_size_v<OpArgs>>{});
  return q;
}

inline Request allreduceRequest(const std::string& name, int64_t n = 4) {
  return request(OpType::kAllreduce, name, {n});
}

inline Request broadcastRequest(const std::string& name, int32_t root, int64_t n = 4) {
  Request q = request(OpType::kBroadcast, name, {n});
  q.args = BroadcastArgs{root};
  return q;
}

// hvd.join()'s request: no tensors.
inline Request joinRequest() {
  Request q = request(OpType::kJoin, "hvdtorch.join");
  q.tensors.clear();
  return q;
}

}  // namespace hvdtorch::test
