#include "ops/reducescatter.h"

#include <algorithm>

#include "common/error.h"
#include "device/devices.h"
#include "device/reduce_kernels.h"
#include "engine/execution/host_staging.h"
#include "ops/op_common.h"
#include "ops/op_table.h"

namespace hvdtorch::ops {

int64_t reducescatter(Engine& engine, ReducescatterOptions opts) {
  OpEntry op(engine, ReducescatterOptions::kType, opts.name, opts.process_set_id);
  op.needRows(opts.inputs);
  if (opts.op == ReduceOp::kAdasum) op.fail("Adasum has no reduce-scatter; use Sum, Average, Min, Max or Product");
  ReduceArgs args = reduceArgs(op.where(), opts.op, opts.prescale, opts.postscale, opts.inputs);
  args.fuse = false;
  return op.submit(std::move(opts.inputs), {}, std::move(opts.allocate), args);
}

int64_t reducescatterRows(int64_t dim0, int size, int rank) { return dim0 / size + (rank < dim0 % size ? 1 : 0); }

OpPlan planReducescatter(const std::vector<const Request*>& by_rank) {
  const int p = static_cast<int>(by_rank.size());
  const Request& first = *by_rank[0];
  ReducescatterPlan plan;
  for (const auto& t : first.tensors) {
    if (t.shape.empty()) throw InvalidArgument("reducescatter needs tensors with at least one dimension");
    for (int r = 0; r < p; ++r) plan.rows.push_back(reducescatterRows(t.shape[0], p, r));
  }
  return plan;
}

namespace {

// A run of tensors [first, last) of one dtype: the elements per row of each
// (indexed by tensor) and each rank's block, its rows of every one of them.
struct RunShape {
  std::vector<size_t> row;
  std::vector<size_t> counts;
};

RunShape runShape(const Entry& e, const ReducescatterPlan& plan, size_t first, size_t last, int p) {
  RunShape shape{std::vector<size_t>(last), std::vector<size_t>(p, 0)};
  for (size_t t = first; t < last; ++t) {
    shape.row[t] = rowElems(e.inputs[t]->shape());
    for (int r = 0; r < p; ++r) shape.counts[r] += static_cast<size_t>(plan.rows[t * p + r]) * shape.row[t];
  }
  return shape;
}

// Reduce-scatters tensors [first, last) of `e` (one dtype) into `outputs`
// as one collective: the tensors are packed block-major in the fusion
// buffer, block r holding rank r's rows of each.
void reducescatterRun(Executor& ex, Entry& e, const ReducescatterPlan& plan, size_t first, size_t last,
                      const std::vector<TensorPtr>& outputs) {
  const ReduceArgs& args = e.request.payload<ReduceArgs>();
  const DataType dtype = e.inputs[first]->dtype();
  const size_t esize = dtypeSize(dtype);
  const int p = ex.ctx().size();
  const int me = ex.ctx().rank();
  const auto [row, counts] = runShape(e, plan, first, last, p);
  const std::vector<size_t> block_at = blockOffsets(counts);
  char* buf = static_cast<char*>(ex.fusion().reserve(std::max<size_t>(1, (block_at[p - 1] + counts[p - 1]) * esize)));

  // Pack, prescaled: block r = rank r's rows of tensor first, then of
  // first + 1, ...
  for (int r = 0; r < p; ++r) {
    size_t at = block_at[r];
    for (size_t t = first; t < last; ++t) {
      size_t row_at = 0;  // first row of rank r in tensor t
      for (int q = 0; q < r; ++q) row_at += static_cast<size_t>(plan.rows[t * p + q]);
      const size_t n = static_cast<size_t>(plan.rows[t * p + r]) * row[t];
      copyScaled(buf + at * esize, static_cast<const char*>(e.inputs[t]->data()) + row_at * row[t] * esize, n, dtype,
                 args.prescale);
      at += n;
    }
  }
  const ReduceOp op = Executor::reducedOp(args.op);
  if (p > 1) {
    Reducer& reducer = ex.router().reduceScatterer((block_at[p - 1] + counts[p - 1]) * esize, dtype, op);
    reducer.reduceScatter(ex.ctx(), buf, counts, dtype, op);
  }
  // Unpack my block: averaged if so asked, postscaled.
  size_t at = block_at[me];
  for (size_t t = first; t < last; ++t) {
    const size_t n = static_cast<size_t>(plan.rows[t * p + me]) * row[t];
    copyAveraged(outputs[t]->data(), buf + at * esize, n, dtype, ex.averageDivisor(args.op), args.postscale);
    at += n;
  }
}

// Device memory only, through the backend's device collectives (NCCL on
// CUDA), on the engine stream. Those scatter equal blocks: every block is
// padded to the largest rank's share (the padding is reduced and dropped),
// the packed blocks are followed by the block this rank receives.
void reducescatterRunOnDevice(Executor& ex, Device& d, Entry& e, const ReducescatterPlan& plan, size_t first,
                              size_t last, const std::vector<TensorPtr>& outputs) {
  const ReduceArgs& args = e.request.payload<ReduceArgs>();
  const DataType dtype = e.inputs[first]->dtype();
  const size_t esize = dtypeSize(dtype);
  const int p = ex.ctx().size();
  const int me = ex.ctx().rank();
  const auto [row, counts] = runShape(e, plan, first, last, p);
  const size_t widest = *std::max_element(counts.begin(), counts.end());
  if (widest == 0) return;  // every output is empty
  char* blocks = static_cast<char*>(ex.router().deviceFusion(d, widest * (p + 1) * esize));
  char* received = blocks + widest * p * esize;
  for (size_t t = first; t < last; ++t) {
    const char* in = static_cast<const char*>(e.inputs[t]->data());
    size_t row_at = 0;  // first row of rank r in tensor t
    for (int r = 0; r < p; ++r) {
      size_t at = widest * r;  // rank r's rows of tensor t follow those of first .. t - 1
      for (size_t u = first; u < t; ++u) at += static_cast<size_t>(plan.rows[u * p + r]) * row[u];
      const size_t n = static_cast<size_t>(plan.rows[t * p + r]) * row[t];
      if (n > 0) d.copyScaled(blocks + at * esize, in + row_at * row[t] * esize, n, dtype, args.prescale, nullptr);
      row_at += static_cast<size_t>(plan.rows[t * p + r]);
    }
  }
  ex.ctx().native()->reducescatterOnDevice(d, blocks, received, widest, dtype, Executor::reducedOp(args.op));
  size_t at = 0;
  for (size_t t = first; t < last; ++t) {
    const size_t n = static_cast<size_t>(plan.rows[t * p + me]) * row[t];
    if (n > 0)
      d.copyAveraged(outputs[t]->data(), received + at * esize, n, dtype, ex.averageDivisor(args.op), args.postscale,
                     nullptr);
    at += n;
  }
}

}  // namespace

// Device tensors take the backend's device collectives where they reduce
// every dtype of the op (decided alike on every rank: the device kind,
// dtypes and op are in the signature) and are otherwise staged through
// pinned host memory (Staging::kByOp in the op table: this function decides).
void executeReducescatter(Executor& ex, WorkUnit& unit) {
  const EntryPtr& entry = unit.pieces.front().entry;
  Entry& e = *entry;
  const ReducescatterPlan& plan = std::get<ReducescatterPlan>(unit.plan);
  const int p = ex.ctx().size();
  const size_t n = e.inputs.size();
  Device* on_device = ex.deviceOrStage(e, Executor::reducedOp(e.request.payload<ReduceArgs>().op));
  if (on_device) waitReady(*on_device, e.inputs);
  std::vector<TensorPtr> outs;
  for (size_t t = 0; t < n; ++t) {
    std::vector<int64_t> shape = e.inputs[t]->shape();
    shape[0] = plan.rows[t * p + ex.ctx().rank()];
    outs.push_back(e.allocate(e.inputs[t]->dtype(), shape));
  }
  ex.mark(unit, "REDUCESCATTER", true);
  // Consecutive tensors of one dtype run as one collective.
  for (size_t first = 0; first < n;) {
    size_t last = first + 1;
    while (last < n && e.inputs[last]->dtype() == e.inputs[first]->dtype()) ++last;
    if (on_device) {
      reducescatterRunOnDevice(ex, *on_device, e, plan, first, last, outs);
    } else {
      reducescatterRun(ex, e, plan, first, last, outs);
    }
    first = last;
  }
  ex.mark(unit, "REDUCESCATTER", false);
  e.outputs = std::move(outs);
  if (on_device) return ex.completeOnDevice(*on_device, entry);
  ex.complete(e);
}

// Its row of the op table (engine/op_spec.h says what each column means).
const OpSpec& reducescatterRow() {
  static const OpSpec row = {OpType::kReducescatter,
                             "reducescatter",
                             argsIndex<ReduceArgs>(),
                             planIndex<ReducescatterPlan>(),
                             /*first_dim_free=*/false,
                             /*cacheable=*/true,
                             /*fuses=*/false,
                             InlineRun::kNever,
                             WhileJoined::kRefused,
                             Outputs::kAllocated,
                             Staging::kByOp,
                             /*make_plan=*/planReducescatter,
                             /*execute=*/executeReducescatter};
  return row;
}

}  // namespace hvdtorch::ops
