// One submitted operation as the engine tracks it: the request it negotiates,
// the buffers it reads and writes, and the state its handle waits on.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "engine/execution/host_staging.h"
#include "engine/op_state.h"
#include "engine/request.h"
#include "engine/tensor.h"

namespace hvdtorch {

struct Entry {
  Request request;
  std::vector<TensorPtr> inputs;  // one per request tensor
  // Allreduce/broadcast: given by the caller, may alias inputs (in place).
  // Allgather/alltoall/reducescatter: made by the engine through `allocate`
  // once negotiation has fixed their shape (alltoall adds the received splits).
  std::vector<TensorPtr> outputs;
  OutputAllocator allocate;
  std::shared_ptr<OpState> state = std::make_shared<OpState>();
  std::atomic<int> pieces_left{0};  // fused pieces still to run (allreduce)
  // Set while the executor runs the op on host copies of its device buffers
  // (Staging::kByExecutor); Executor::complete() copies the outputs back.
  std::unique_ptr<StagedEntry> staged;
};

using EntryPtr = std::shared_ptr<Entry>;

// A unit of execution: what the executor runs as one collective. Allreduce
// units may fuse pieces of several entries; other ops have one entry, and
// carry the plan negotiation made for it.
struct WorkUnit {
  struct Piece {
    EntryPtr entry;
    size_t tensor = 0;
  };
  OpType type = OpType::kAllreduce;
  // Its op's row of the op table (planWork looks it up once per op, so the
  // executor and the work queue need not); null only in an error unit.
  const OpSpec* spec = nullptr;
  std::vector<Piece> pieces;
  std::string error;  // non-empty: fail every entry, run nothing
  OpPlan plan;
  size_t bytes = 0;
};

}  // namespace hvdtorch
