#include "ops/alltoall.h"

#include <algorithm>
#include <numeric>

#include "algorithms/alltoall.h"
#include "common/error.h"
#include "device/devices.h"
#include "engine/execution/host_staging.h"
#include "ops/op_common.h"
#include "ops/op_table.h"

namespace hvdtorch::ops {

namespace {

std::string listStr(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += strCat(i ? ", " : "", v[i]);
  return s + "]";
}

}  // namespace

int64_t alltoall(Engine& engine, AlltoallOptions opts) {
  OpEntry op(engine, AlltoallOptions::kType, opts.name, opts.process_set_id);
  const std::vector<int64_t> shape = opts.input->shape();
  if (shape.empty()) op.fail("the tensor needs at least one dimension");
  const int size = static_cast<int>(op.processSet().ranks.size());
  const int64_t dim0 = shape[0];
  if (opts.splits.empty()) {
    if (dim0 % size != 0)
      op.fail("splits not given, and the first dimension ", dim0, " is not a multiple of the number of ranks ", size);
    opts.splits.assign(size, dim0 / size);
  }
  if (static_cast<int>(opts.splits.size()) != size)
    op.fail("splits ", listStr(opts.splits), " has ", opts.splits.size(), " entries; it needs one per rank (", size,
            ")");
  for (int64_t s : opts.splits)
    if (s < 0) op.fail("splits ", listStr(opts.splits), " has a negative entry");
  const int64_t sum = std::accumulate(opts.splits.begin(), opts.splits.end(), int64_t(0));
  if (sum != dim0) op.fail("splits ", listStr(opts.splits), " sum to ", sum, ", not to the first dimension ", dim0);
  return op.submit({std::move(opts.input)}, {}, std::move(opts.allocate), AlltoallArgs{std::move(opts.splits)});
}

OpPlan planAlltoall(const std::vector<const Request*>& by_rank) {
  const int p = static_cast<int>(by_rank.size());
  AlltoallPlan plan;
  for (int r = 0; r < p; ++r) {
    const std::vector<int64_t>& splits = by_rank[r]->payload<AlltoallArgs>().splits;
    const auto& shape = by_rank[r]->tensors.at(0).shape;
    const int64_t dim0 = shape.empty() ? 0 : shape[0];
    const bool fits = static_cast<int>(splits.size()) == p &&
                      std::all_of(splits.begin(), splits.end(), [](int64_t s) { return s >= 0; }) &&
                      std::accumulate(splits.begin(), splits.end(), int64_t(0)) == dim0;
    if (!fits)
      throw InvalidArgument(strCat("rank ", r, " submitted splits ", listStr(splits),
                                   " that do not divide its first dimension ", dim0, " among ", p, " ranks"));
    plan.splits.insert(plan.splits.end(), splits.begin(), splits.end());
  }
  return plan;
}

// Device tensors take the backend's device collectives where it has them
// (decided alike on every rank: the device kind is in the signature) and
// are otherwise staged through pinned host memory (Staging::kByOp in the op
// table: this function decides). The received splits are host metadata: a
// host tensor whatever the device, as Horovod returns them.
void executeAlltoall(Executor& ex, WorkUnit& unit) {
  const EntryPtr& entry = unit.pieces.front().entry;
  Entry& e = *entry;
  const AlltoallPlan& plan = std::get<AlltoallPlan>(unit.plan);
  const int p = ex.ctx().size();
  const int me = ex.ctx().rank();
  Device* on_device = ex.deviceOrStage(e);
  if (on_device) waitReady(*on_device, e.inputs);
  TensorBuffer& in = *e.inputs[0];
  std::vector<int64_t> shape = in.shape();
  const size_t row_bytes = rowElems(shape) * dtypeSize(in.dtype());
  hvdtorch::AlltoallOptions opts;
  opts.input = in.data();
  opts.send_bytes.resize(p);
  opts.recv_bytes.resize(p);
  auto received = std::make_shared<HostTensor>(DataType::kInt64, std::vector<int64_t>{p});
  auto* received_rows = static_cast<int64_t*>(received->data());
  int64_t total_rows = 0;
  for (int r = 0; r < p; ++r) {
    opts.send_bytes[r] = static_cast<size_t>(plan.splits[me * p + r]) * row_bytes;
    received_rows[r] = plan.splits[r * p + me];
    opts.recv_bytes[r] = static_cast<size_t>(received_rows[r]) * row_bytes;
    total_rows += received_rows[r];
  }
  shape[0] = total_rows;
  TensorPtr out = e.allocate(in.dtype(), shape);
  opts.output = out->data();
  ex.mark(unit, "ALLTOALL", true);
  if (!on_device) {
    hvdtorch::alltoall(ex.ctx(), opts);
  } else if (std::any_of(plan.splits.begin(), plan.splits.end(), [](int64_t s) { return s > 0; })) {
    // Every rank takes part while any rank sends a row.
    ex.ctx().native()->alltoallOnDevice(*on_device, opts.input, opts.output, opts.send_bytes, opts.recv_bytes);
  }
  ex.mark(unit, "ALLTOALL", false);
  e.outputs = {out, received};
  if (on_device) return ex.completeOnDevice(*on_device, entry);
  ex.complete(e);
}

// Its row of the op table (engine/op_spec.h says what each column means).
const OpSpec& alltoallRow() {
  static const OpSpec row = {OpType::kAlltoall,
                             "alltoall",
                             argsIndex<AlltoallArgs>(),
                             planIndex<AlltoallPlan>(),
                             /*first_dim_free=*/true,
                             /*cacheable=*/false,
                             /*fuses=*/false,
                             InlineRun::kNever,
                             WhileJoined::kRefused,
                             Outputs::kAllocated,
                             Staging::kByOp,
                             /*make_plan=*/planAlltoall,
                             /*execute=*/executeAlltoall};
  return row;
}

}  // namespace hvdtorch::ops
