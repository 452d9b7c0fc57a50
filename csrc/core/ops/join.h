// Join (Horovod's hvd.join()): this rank is out of data. Until every rank has
// joined, the others' all-reduces, allgathers, broadcasts and barriers run
// with this rank taking part on zeros (Coordinator says exactly how). The op
// completes once every rank has joined; its output, an int32 scalar, is the
// rank that joined last.
#pragma once

#include <string>
#include <tuple>

#include "engine/engine.h"
#include "ops/option_fields.h"

namespace hvdtorch::ops {

struct JoinOptions {
  static constexpr OpType kType = OpType::kJoin;
  // The same on every rank, and used by no other op. Always the global set.
  std::string name = "hvdtorch.join";
  OutputAllocator allocate;
  // Its plain fields, which the Python binding sets by name (ops/option_fields.h).
  static constexpr auto fields() { return std::make_tuple(field("name", &JoinOptions::name)); }
};

int64_t join(Engine& engine, JoinOptions opts);

// Its row's execute (engine/op_spec.h).
void executeJoin(Executor& ex, WorkUnit& unit);

}  // namespace hvdtorch::ops
