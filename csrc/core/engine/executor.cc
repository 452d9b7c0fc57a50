#include "engine/executor.h"

#include <cstring>

#include "algorithms/alltoall.h"
#include "algorithms/ring_allgather.h"
#include "common/error.h"
#include "device/reduce_kernels.h"

namespace hvdtorch {

namespace {

// Elements of one row (everything but dimension 0) of `shape`.
size_t rowElems(const std::vector<int64_t>& shape) {
  size_t row = 1;
  for (size_t d = 1; d < shape.size(); ++d) row *= static_cast<size_t>(shape[d]);
  return row;
}

}  // namespace

// Average is the one reduce op no reducer sees: it is a Sum whose result is
// divided by the number of ranks on the way out (exactly, for integers).
ReduceOp Executor::reducedOp(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

int64_t Executor::averageDivisor(ReduceOp op) const { return op == ReduceOp::kAverage ? ctx_.size() : 1; }

void Executor::mark(const WorkUnit& unit, const std::string& phase, bool begin) {
  if (!timeline_.enabled()) return;
  const Entry* last = nullptr;
  for (const auto& p : unit.pieces) {
    if (p.entry.get() == last) continue;  // a grouped op contributes several pieces
    last = p.entry.get();
    if (begin) {
      timeline_.begin(p.entry->request.name, phase);
    } else {
      timeline_.end(p.entry->request.name, phase);
    }
  }
}

void Executor::run(WorkUnit& unit) {
  mark(unit, "QUEUE", false);
  if (!unit.error.empty()) {
    for (auto& p : unit.pieces) p.entry->state->fail(unit.error);
    return;
  }
  switch (unit.type) {
    case OpType::kAllreduce: return allreduce(unit);
    case OpType::kAllgather: return allgather(unit);
    case OpType::kBroadcast: return broadcast(unit);
    case OpType::kBarrier: return barrier(unit);
    case OpType::kAlltoall: return alltoall(unit);
    case OpType::kReducescatter: return reducescatter(unit);
    case OpType::kJoin: return join(unit);
  }
}

void Executor::finishPiece(const WorkUnit::Piece& piece) {
  if (--piece.entry->pieces_left == 0) piece.entry->state->complete(piece.entry->outputs);
}

void Executor::allreduce(WorkUnit& unit) {
  const Request& req = unit.pieces.front().entry->request;
  const ReduceArgs& args = req.reduce();
  const DataType dtype = req.tensors[unit.pieces.front().tensor].dtype;
  size_t count = 0;
  for (const auto& p : unit.pieces) count += static_cast<size_t>(p.entry->request.tensors[p.tensor].numel());
  const ReduceOp op = reducedOp(args.op);
  const int64_t divisor = averageDivisor(args.op);
  Reducer& reducer = reducers_.pick(args.reducer, ctx_, count * dtypeSize(dtype), dtype, op);

  const std::string collective = strCat("ALLREDUCE:", reducer.name());
  if (unit.pieces.size() == 1) {
    // One tensor: reduce straight in the output, no fusion-buffer copies.
    const auto& p = unit.pieces.front();
    TensorBuffer& in = *p.entry->inputs[p.tensor];
    TensorBuffer& out = *p.entry->outputs[p.tensor];
    copyScaled(out.data(), in.data(), count, dtype, args.prescale);
    mark(unit, collective, true);
    p.entry->state->times.reduce_begun = OpTimes::now();
    if (ctx_.size() > 1) reducers_.allreduce(ctx_, reducer, out.data(), count, dtype, op);  // timed into `auto`'s model
    p.entry->state->times.reduce_ended = OpTimes::now();
    mark(unit, collective, false);
    copyAveraged(out.data(), out.data(), count, dtype, divisor, args.postscale);
    finishPiece(p);
    return;
  }

  const size_t esize = dtypeSize(dtype);
  char* fused = static_cast<char*>(fusion_.reserve(count * esize));
  size_t off = 0;
  mark(unit, "MEMCPY_IN_FUSION", true);
  for (const auto& p : unit.pieces) {
    TensorBuffer& in = *p.entry->inputs[p.tensor];
    const size_t n = static_cast<size_t>(in.numel());
    copyScaled(fused + off * esize, in.data(), n, dtype, args.prescale);
    off += n;
  }
  mark(unit, "MEMCPY_IN_FUSION", false);
  mark(unit, collective, true);
  if (ctx_.size() > 1) reducers_.allreduce(ctx_, reducer, fused, count, dtype, op);  // timed into `auto`'s model
  mark(unit, collective, false);
  mark(unit, "MEMCPY_OUT_FUSION", true);
  off = 0;
  for (const auto& p : unit.pieces) {
    TensorBuffer& out = *p.entry->outputs[p.tensor];
    const size_t n = static_cast<size_t>(out.numel());
    copyAveraged(out.data(), fused + off * esize, n, dtype, divisor, args.postscale);
    off += n;
  }
  mark(unit, "MEMCPY_OUT_FUSION", false);
  for (const auto& p : unit.pieces) finishPiece(p);
}

void Executor::allgather(WorkUnit& unit) {
  Entry& e = *unit.pieces.front().entry;
  const AllgatherPlan& plan = std::get<AllgatherPlan>(unit.plan);
  const size_t n = e.inputs.size();
  const int p = ctx_.size();
  std::vector<TensorPtr> outs;
  mark(unit, "ALLGATHER", true);
  for (size_t t = 0; t < n; ++t) {
    TensorBuffer& in = *e.inputs[t];
    std::vector<int64_t> shape = in.shape();
    const size_t row_bytes = rowElems(shape) * dtypeSize(in.dtype());
    std::vector<size_t> bytes(p);
    int64_t total_rows = 0;
    for (int r = 0; r < p; ++r) {
      const int64_t rows = plan.first_dims[r * n + t];
      bytes[r] = static_cast<size_t>(rows) * row_bytes;
      total_rows += rows;
    }
    shape[0] = total_rows;
    outs.push_back(e.allocate(in.dtype(), shape));
    ringAllgatherv(ctx_, in.data(), outs.back()->data(), bytes);
  }
  mark(unit, "ALLGATHER", false);
  e.outputs = std::move(outs);
  e.state->complete(e.outputs);
}

void Executor::broadcast(WorkUnit& unit) {
  Entry& e = *unit.pieces.front().entry;
  const int root = e.request.broadcast().root;
  TensorBuffer& in = *e.inputs[0];
  TensorBuffer& out = *e.outputs[0];
  if (ctx_.rank() == root && in.data() != out.data()) std::memcpy(out.data(), in.data(), in.bytes());
  mark(unit, "BROADCAST", true);
  if (ctx_.native() != nullptr) {
    ctx_.native()->broadcast(out.data(), out.bytes(), root);
  } else {
    chainBroadcast(ctx_, out.data(), out.bytes(), root);
  }
  mark(unit, "BROADCAST", false);
  e.state->complete(e.outputs);
}

void Executor::barrier(WorkUnit& unit) {
  if (ctx_.native() != nullptr) {
    ctx_.native()->barrier();
  } else {
    int32_t token = 0;
    reducers_.resolve(kAutoReducer, ctx_, sizeof token, DataType::kInt32, ReduceOp::kSum)
        .allreduce(ctx_, &token, 1, DataType::kInt32, ReduceOp::kSum);
  }
  unit.pieces.front().entry->state->complete();
}

void Executor::join(WorkUnit& unit) {
  // Nothing moves: negotiation already made every rank wait for the last one.
  Entry& e = *unit.pieces.front().entry;
  TensorPtr out = e.allocate(DataType::kInt32, {});
  *static_cast<int32_t*>(out->data()) = std::get<JoinPlan>(unit.plan).last_rank;
  e.state->complete({out});
}

void Executor::alltoall(WorkUnit& unit) {
  Entry& e = *unit.pieces.front().entry;
  const AlltoallPlan& plan = std::get<AlltoallPlan>(unit.plan);
  TensorBuffer& in = *e.inputs[0];
  std::vector<int64_t> shape = in.shape();
  const size_t row_bytes = rowElems(shape) * dtypeSize(in.dtype());
  const int p = ctx_.size();
  const int me = ctx_.rank();
  AlltoallOptions opts;
  opts.input = in.data();
  opts.send_bytes.resize(p);
  opts.recv_bytes.resize(p);
  TensorPtr received = e.allocate(DataType::kInt64, {p});
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
  mark(unit, "ALLTOALL", true);
  hvdtorch::alltoall(ctx_, opts);
  mark(unit, "ALLTOALL", false);
  e.outputs = {out, received};
  e.state->complete(e.outputs);
}

void Executor::reducescatter(WorkUnit& unit) {
  Entry& e = *unit.pieces.front().entry;
  const ReducescatterPlan& plan = std::get<ReducescatterPlan>(unit.plan);
  const int p = ctx_.size();
  const size_t n = e.inputs.size();
  std::vector<TensorPtr> outs;
  for (size_t t = 0; t < n; ++t) {
    std::vector<int64_t> shape = e.inputs[t]->shape();
    shape[0] = plan.rows[t * p + ctx_.rank()];
    outs.push_back(e.allocate(e.inputs[t]->dtype(), shape));
  }
  mark(unit, "REDUCESCATTER", true);
  // Consecutive tensors of one dtype run as one collective.
  for (size_t first = 0; first < n;) {
    size_t last = first + 1;
    while (last < n && e.inputs[last]->dtype() == e.inputs[first]->dtype()) ++last;
    reducescatterRun(e, plan, first, last, outs);
    first = last;
  }
  mark(unit, "REDUCESCATTER", false);
  e.outputs = std::move(outs);
  e.state->complete(e.outputs);
}

void Executor::reducescatterRun(Entry& e, const ReducescatterPlan& plan, size_t first, size_t last,
                                const std::vector<TensorPtr>& outputs) {
  const ReduceArgs& args = e.request.reduce();
  const DataType dtype = e.inputs[first]->dtype();
  const size_t esize = dtypeSize(dtype);
  const int p = ctx_.size();
  const int me = ctx_.rank();
  std::vector<size_t> row(last), counts(p, 0);
  for (size_t t = first; t < last; ++t) {
    row[t] = rowElems(e.inputs[t]->shape());
    for (int r = 0; r < p; ++r) counts[r] += static_cast<size_t>(plan.rows[t * p + r]) * row[t];
  }
  const std::vector<size_t> block_at = blockOffsets(counts);
  char* buf = static_cast<char*>(fusion_.reserve(std::max<size_t>(1, (block_at[p - 1] + counts[p - 1]) * esize)));

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
  const ReduceOp op = reducedOp(args.op);
  if (p > 1) {
    Reducer& reducer = reducers_.reduceScatterer(ctx_, (block_at[p - 1] + counts[p - 1]) * esize, dtype, op);
    reducer.reduceScatter(ctx_, buf, counts, dtype, op);
  }
  // Unpack my block: averaged if so asked, postscaled.
  size_t at = block_at[me];
  for (size_t t = first; t < last; ++t) {
    const size_t n = static_cast<size_t>(plan.rows[t * p + me]) * row[t];
    copyAveraged(outputs[t]->data(), buf + at * esize, n, dtype, averageDivisor(args.op), args.postscale);
    at += n;
  }
}

}  // namespace hvdtorch
