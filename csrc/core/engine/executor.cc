#include "engine/executor.h"

#include <cstring>

#include "algorithms/reduce_kernels.h"
#include "algorithms/ring_allgather.h"
#include "common/error.h"

namespace hvdtorch {

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
  }
}

void Executor::finishPiece(const WorkUnit::Piece& piece) {
  if (--piece.entry->pieces_left == 0) piece.entry->state->complete(piece.entry->outputs);
}

void Executor::allreduce(WorkUnit& unit) {
  const Request& req = unit.pieces.front().entry->request;
  const DataType dtype = req.tensors[unit.pieces.front().tensor].dtype;
  size_t count = 0;
  for (const auto& p : unit.pieces) count += static_cast<size_t>(p.entry->request.tensors[p.tensor].numel());
  // Average is the one reduce op no reducer sees: it is a Sum whose result is
  // divided by the number of ranks on the way out (exactly, for integers).
  const bool average = req.op == ReduceOp::kAverage;
  const ReduceOp op = average ? ReduceOp::kSum : req.op;
  const int64_t divisor = average ? ctx_.size() : 1;
  Reducer& reducer = reducers_.resolve(req.reducer, ctx_, count * dtypeSize(dtype), dtype, op);

  const std::string collective = strCat("ALLREDUCE:", reducer.name());
  if (unit.pieces.size() == 1) {
    // One tensor: reduce straight in the output, no fusion-buffer copies.
    const auto& p = unit.pieces.front();
    TensorBuffer& in = *p.entry->inputs[p.tensor];
    TensorBuffer& out = *p.entry->outputs[p.tensor];
    copyScaled(out.data(), in.data(), count, dtype, req.prescale);
    mark(unit, collective, true);
    if (ctx_.size() > 1) reducer.allreduce(ctx_, out.data(), count, dtype, op);
    mark(unit, collective, false);
    copyAveraged(out.data(), out.data(), count, dtype, divisor, req.postscale);
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
    copyScaled(fused + off * esize, in.data(), n, dtype, req.prescale);
    off += n;
  }
  mark(unit, "MEMCPY_IN_FUSION", false);
  mark(unit, collective, true);
  if (ctx_.size() > 1) reducer.allreduce(ctx_, fused, count, dtype, op);
  mark(unit, collective, false);
  mark(unit, "MEMCPY_OUT_FUSION", true);
  off = 0;
  for (const auto& p : unit.pieces) {
    TensorBuffer& out = *p.entry->outputs[p.tensor];
    const size_t n = static_cast<size_t>(out.numel());
    copyAveraged(out.data(), fused + off * esize, n, dtype, divisor, req.postscale);
    off += n;
  }
  mark(unit, "MEMCPY_OUT_FUSION", false);
  for (const auto& p : unit.pieces) finishPiece(p);
}

void Executor::allgather(WorkUnit& unit) {
  Entry& e = *unit.pieces.front().entry;
  TensorBuffer& in = *e.inputs[0];
  std::vector<int64_t> shape = in.shape();
  if (shape.empty()) shape = {1};  // a scalar gathers as a 1-element row
  int64_t row = 1;
  for (size_t d = 1; d < shape.size(); ++d) row *= shape[d];
  const size_t row_bytes = static_cast<size_t>(row) * dtypeSize(in.dtype());

  const int p = ctx_.size();
  std::vector<size_t> bytes(p);
  int64_t total_rows = 0;
  for (int r = 0; r < p; ++r) {
    bytes[r] = static_cast<size_t>(unit.first_dims[r]) * row_bytes;
    total_rows += unit.first_dims[r];
  }
  shape[0] = total_rows;
  TensorPtr out = e.allocate(shape);
  mark(unit, "ALLGATHER", true);
  ringAllgatherv(ctx_, in.data(), out->data(), bytes);
  mark(unit, "ALLGATHER", false);
  e.outputs = {out};
  e.state->complete(e.outputs);
}

void Executor::broadcast(WorkUnit& unit) {
  Entry& e = *unit.pieces.front().entry;
  TensorBuffer& in = *e.inputs[0];
  TensorBuffer& out = *e.outputs[0];
  if (ctx_.rank() == e.request.root && in.data() != out.data()) std::memcpy(out.data(), in.data(), in.bytes());
  mark(unit, "BROADCAST", true);
  if (ctx_.native() != nullptr) {
    ctx_.native()->broadcast(out.data(), out.bytes(), e.request.root);
  } else {
    chainBroadcast(ctx_, out.data(), out.bytes(), e.request.root);
  }
  mark(unit, "BROADCAST", false);
  e.state->complete(e.outputs);
}

void Executor::barrier(WorkUnit& unit) {
  if (ctx_.native() != nullptr) {
    ctx_.native()->barrier();
  } else {
    int32_t token = 0;
    reducers_.get(ReducerKind::kRing).allreduce(ctx_, &token, 1, DataType::kInt32, ReduceOp::kSum);
  }
  unit.pieces.front().entry->state->complete();
}

}  // namespace hvdtorch
