#include "ops/allgather.h"

#include <algorithm>

#include "algorithms/hierarchical_allgather.h"
#include "algorithms/ring_allgather.h"
#include "common/error.h"
#include "device/devices.h"
#include "engine/execution/host_staging.h"
#include "ops/op_common.h"
#include "ops/op_table.h"

namespace hvdtorch::ops {

int64_t allgather(Engine& engine, AllgatherOptions opts) {
  OpEntry op(engine, AllgatherOptions::kType, opts.name, opts.process_set_id);
  op.needRows(opts.inputs);
  return op.submit(std::move(opts.inputs), {}, std::move(opts.allocate));
}

OpPlan planAllgather(const std::vector<const Request*>& by_rank) {
  const int p = static_cast<int>(by_rank.size());
  AllgatherPlan plan;
  for (int r = 0; r < p; ++r)
    for (const auto& t : by_rank[r]->tensors) plan.first_dims.push_back(t.shape.empty() ? 1 : t.shape[0]);
  return plan;
}

namespace {

// Bytes of tensor t that rank r contributes.
size_t blockBytes(const Entry& e, const AllgatherPlan& plan, size_t t, int r) {
  const TensorBuffer& in = *e.inputs[t];
  return static_cast<size_t>(plan.first_dims[r * e.inputs.size() + t]) * rowElems(in.shape()) * dtypeSize(in.dtype());
}

// The outputs, dimension 0 being the sum of every rank's rows.
std::vector<TensorPtr> allocateOutputs(Entry& e, const AllgatherPlan& plan, int p) {
  std::vector<TensorPtr> outs;
  for (size_t t = 0; t < e.inputs.size(); ++t) {
    std::vector<int64_t> shape = e.inputs[t]->shape();
    shape[0] = 0;
    for (int r = 0; r < p; ++r) shape[0] += plan.first_dims[r * e.inputs.size() + t];
    outs.push_back(e.allocate(e.inputs[t]->dtype(), shape));
  }
  return outs;
}

// Device memory only, through the backend's device collectives (NCCL on
// CUDA), on the engine stream. Those gather equal blocks: one tensor of
// equal rows everywhere is gathered straight into its output; otherwise
// each rank packs its tensors into a block of the largest rank's size, and
// the gathered blocks are unpacked into the outputs, all on the device.
void allgatherOnDevice(Executor& ex, WorkUnit& unit, Device& d) {
  const EntryPtr& entry = unit.pieces.front().entry;
  Entry& e = *entry;
  const AllgatherPlan& plan = std::get<AllgatherPlan>(unit.plan);
  const size_t n = e.inputs.size();
  const int p = ex.ctx().size();
  waitReady(d, e.inputs);
  std::vector<TensorPtr> outs = allocateOutputs(e, plan, p);
  std::vector<size_t> block(p, 0);  // rank r's bytes, all tensors
  for (int r = 0; r < p; ++r)
    for (size_t t = 0; t < n; ++t) block[r] += blockBytes(e, plan, t, r);
  const size_t widest = *std::max_element(block.begin(), block.end());
  const bool equal = std::all_of(block.begin(), block.end(), [&](size_t b) { return b == widest; });
  ex.mark(unit, "ALLGATHER", true);
  NativeCollectives& backend = *ex.ctx().native();
  if (widest == 0) {
    // Nothing to move: every output has no rows.
  } else if (n == 1 && equal) {
    backend.allgatherOnDevice(d, e.inputs[0]->data(), outs[0]->data(), widest);
  } else {
    char* gathered = static_cast<char*>(ex.router().deviceFusion(d, widest * (p + 1)));
    char* mine = gathered + widest * p;
    size_t at = 0;
    for (size_t t = 0; t < n; ++t) {
      d.copy(mine + at, e.inputs[t]->data(), e.inputs[t]->bytes(), nullptr);
      at += e.inputs[t]->bytes();
    }
    backend.allgatherOnDevice(d, mine, gathered, widest);
    std::vector<size_t> out_at(n, 0);  // bytes of each output written so far
    for (int r = 0; r < p; ++r) {
      size_t in_block = 0;
      for (size_t t = 0; t < n; ++t) {
        const size_t bytes = blockBytes(e, plan, t, r);
        if (bytes > 0)
          d.copy(static_cast<char*>(outs[t]->data()) + out_at[t], gathered + widest * r + in_block, bytes, nullptr);
        out_at[t] += bytes;
        in_block += bytes;
      }
    }
  }
  ex.mark(unit, "ALLGATHER", false);
  e.outputs = std::move(outs);
  ex.completeOnDevice(d, entry);
}

}  // namespace

// Device tensors take the backend's device collectives where it has them
// (decided alike on every rank: the device kind is in the signature) and
// are otherwise staged through pinned host memory (Staging::kByOp in the op
// table: this function decides). Host memory takes the hierarchical
// all-gather on several hosts of as many ranks each, the ring otherwise.
void executeAllgather(Executor& ex, WorkUnit& unit) {
  Entry& e = *unit.pieces.front().entry;
  const AllgatherPlan& plan = std::get<AllgatherPlan>(unit.plan);
  const int p = ex.ctx().size();
  if (Device* d = ex.deviceOrStage(e)) return allgatherOnDevice(ex, unit, *d);
  std::vector<TensorPtr> outs = allocateOutputs(e, plan, p);
  // Across hosts each byte crosses a host's link once (hierarchical_allgather.h).
  const bool hierarchical = hierarchicalAllgatherApplies(ex.ctx().topo());
  ex.mark(unit, "ALLGATHER", true);
  for (size_t t = 0; t < e.inputs.size(); ++t) {
    std::vector<size_t> bytes(p);
    for (int r = 0; r < p; ++r) bytes[r] = blockBytes(e, plan, t, r);
    if (hierarchical) {
      hierarchicalAllgatherv(ex.ctx(), e.inputs[t]->data(), outs[t]->data(), bytes);
    } else {
      ringAllgatherv(ex.ctx(), e.inputs[t]->data(), outs[t]->data(), bytes);
    }
  }
  ex.mark(unit, "ALLGATHER", false);
  e.outputs = std::move(outs);
  ex.complete(e);
}

// Its row of the op table (engine/op_spec.h says what each column means).
const OpSpec& allgatherRow() {
  static const OpSpec row = {OpType::kAllgather,
                             "allgather",
                             argsIndex<NoArgs>(),
                             planIndex<AllgatherPlan>(),
                             /*first_dim_free=*/true,
                             /*cacheable=*/false,
                             /*fuses=*/false,
                             InlineRun::kNever,
                             WhileJoined::kAddsNoRows,
                             Outputs::kAllocated,
                             Staging::kByOp,
                             /*make_plan=*/planAllgather,
                             /*execute=*/executeAllgather};
  return row;
}

}  // namespace hvdtorch::ops
