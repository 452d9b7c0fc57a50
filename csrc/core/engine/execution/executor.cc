#include "engine/execution/executor.h"

#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "device/devices.h"

namespace hvdtorch {

size_t rowElems(const std::vector<int64_t>& shape) {
  size_t row = 1;
  for (size_t d = 1; d < shape.size(); ++d) row *= static_cast<size_t>(shape[d]);
  return row;
}

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

void Executor::reduceOnHost(const WorkUnit& unit, Reducer& reducer, void* data, size_t count, DataType dtype,
                            ReduceOp op, OpTimes* times, const void* in) {
  const std::string collective = strCat("ALLREDUCE:", reducer.name());
  mark(unit, collective, true);
  if (times) times->reduce_begun = OpTimes::now();
  if (ctx_.size() > 1) {
    router_.reducers().allreduce(ctx_, reducer, data, count, dtype, op, in);  // timed into `auto`'s model
  } else if (in != nullptr && in != data) {
    std::memcpy(data, in, count * dtypeSize(dtype));
  }
  if (times) times->reduce_ended = OpTimes::now();
  mark(unit, collective, false);
}

Executor::~Executor() {
  // A device ring's stream may wait for a flag a failed peer never writes:
  // released first (a no-op for rings closed cleanly).
  router_.releaseRingWaits();
  for (auto& f : in_flight_) {
    try {
      f.device->synchronize(*f.done);
    } catch (const std::exception& e) {
      // The device failed; say so, and free the buffers anyway.
      std::fprintf(stderr, "hvdtorch: waiting for device work at shutdown on %s: %s\n", f.device->id().str().c_str(),
                   e.what());
    }
  }
  in_flight_.clear();
}

void Executor::releaseFinished() {
  while (!in_flight_.empty() && in_flight_.front().device->query(*in_flight_.front().done)) in_flight_.pop_front();
}

void Executor::holdUntil(Device& device, std::shared_ptr<Event> done, EntryPtr entry) {
  in_flight_.push_back({&device, std::move(done), std::move(entry)});
}

void Executor::completeOnDevice(Device& device, const EntryPtr& entry) {
  std::shared_ptr<Event> done = device.newEvent();
  device.record(*done, nullptr);
  entry->state->device = device.id();
  entry->state->completion = done;
  holdUntil(device, std::move(done), entry);
  complete(*entry);
}

Device* Executor::deviceOrStage(Entry& e, std::optional<ReduceOp> reduce) {
  if (e.request.tensors.empty() || e.request.tensors[0].device == DeviceKind::kCpu) return nullptr;
  Device& d = deviceFor((!e.inputs.empty() ? e.inputs.front() : e.outputs.front())->device());
  std::vector<DataType> dtypes;
  dtypes.reserve(e.inputs.size());
  for (const auto& t : e.inputs) dtypes.push_back(t->dtype());
  if (Device* on = router_.placement(d, dtypes, reduce)) return on;
  e.staged = StagedEntry::stageIn(e, staging_);
  return nullptr;
}

void Executor::run(WorkUnit& unit) {
  releaseFinished();
  mark(unit, "QUEUE", false);
  if (!unit.error.empty()) {
    for (auto& p : unit.pieces) p.entry->state->fail(unit.error);
    return;
  }
  const OpSpec& spec = *unit.spec;
  // Released whatever happens: the next unit starts from an empty pool.
  struct ResetPool {
    StagingPool& pool;
    ~ResetPool() { pool.reset(); }
  } reset{staging_};
  if (spec.staging == Staging::kByExecutor) {
    Entry& e = *unit.pieces.front().entry;  // these ops never fuse: one entry per unit
    const bool on_device = (!e.inputs.empty() && e.inputs.front()->device().kind != DeviceKind::kCpu) ||
                           (!e.outputs.empty() && e.outputs.front()->device().kind != DeviceKind::kCpu);
    if (on_device) e.staged = StagedEntry::stageIn(e, staging_);
  }
  spec.execute(*this, unit);
}

void Executor::finishPiece(const WorkUnit::Piece& piece) {
  if (--piece.entry->pieces_left == 0) complete(*piece.entry);
}

void Executor::complete(Entry& entry) {
  if (entry.staged) {
    entry.staged->stageOut(entry);
    entry.staged.reset();
  }
  entry.state->complete(entry.outputs);
}

}  // namespace hvdtorch
