#include "ops/broadcast.h"

#include <cstring>

#include "algorithms/ring_allgather.h"
#include "common/error.h"
#include "device/devices.h"
#include "engine/execution/host_staging.h"
#include "ops/op_common.h"
#include "ops/op_table.h"

namespace hvdtorch::ops {

int64_t broadcast(Engine& engine, BroadcastOptions opts) {
  OpEntry op(engine, BroadcastOptions::kType, opts.name, opts.process_set_id);
  const int32_t set_root = op.rootInSet(opts.root);
  op.outputLikeInput(*opts.input, *opts.output);
  return op.submit({std::move(opts.input)}, {std::move(opts.output)}, nullptr, BroadcastArgs{set_root});
}

namespace {

// Device memory only, through the backend's device collectives (NCCL on
// CUDA), on the engine stream: the op completes without the host waiting
// for the device, the caller's stream waiting on `done` instead.
void broadcastOnDevice(Executor& ex, WorkUnit& unit, Device& d) {
  const EntryPtr& entry = unit.pieces.front().entry;
  Entry& e = *entry;
  const int root = e.request.payload<BroadcastArgs>().root;
  TensorBuffer& in = *e.inputs[0];
  TensorBuffer& out = *e.outputs[0];
  waitReady(d, {e.inputs[0], e.outputs[0]});
  if (ex.ctx().rank() == root && in.data() != out.data()) d.copy(out.data(), in.data(), in.bytes(), nullptr);
  ex.mark(unit, "BROADCAST", true);
  ex.ctx().native()->broadcastOnDevice(d, out.data(), out.bytes(), root);
  ex.mark(unit, "BROADCAST", false);
  ex.completeOnDevice(d, entry);
}

}  // namespace

// Device tensors take the backend's device collectives where it has them
// (decided alike on every rank: the device kind is in the signature) and
// are otherwise staged through pinned host memory, as the executor stages
// the other ops (Staging::kByOp in the op table: this function decides).
void executeBroadcast(Executor& ex, WorkUnit& unit) {
  Entry& e = *unit.pieces.front().entry;
  if (Device* d = ex.deviceOrStage(e)) return broadcastOnDevice(ex, unit, *d);
  const int root = e.request.payload<BroadcastArgs>().root;
  TensorBuffer& in = *e.inputs[0];
  TensorBuffer& out = *e.outputs[0];
  if (ex.ctx().rank() == root && in.data() != out.data()) std::memcpy(out.data(), in.data(), in.bytes());
  ex.mark(unit, "BROADCAST", true);
  if (ex.ctx().native() != nullptr) {
    ex.ctx().native()->broadcast(out.data(), out.bytes(), root);
  } else {
    chainBroadcast(ex.ctx(), out.data(), out.bytes(), root);
  }
  ex.mark(unit, "BROADCAST", false);
  ex.complete(e);
}

// Its row of the op table (engine/op_spec.h says what each column means).
const OpSpec& broadcastRow() {
  static const OpSpec row = {OpType::kBroadcast,
                             "broadcast",
                             argsIndex<BroadcastArgs>(),
                             planIndex<NoPlan>(),
                             /*first_dim_free=*/false,
                             /*cacheable=*/true,
                             /*fuses=*/false,
                             InlineRun::kNever,
                             WhileJoined::kReceives,
                             Outputs::kLikeInputs,
                             Staging::kByOp,
                             /*make_plan=*/nullptr,
                             /*execute=*/executeBroadcast};
  return row;
}

}  // namespace hvdtorch::ops
