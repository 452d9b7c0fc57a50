#include "engine/executor.h"

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

void Executor::run(WorkUnit& unit) {
  mark(unit, "QUEUE", false);
  if (!unit.error.empty()) {
    for (auto& p : unit.pieces) p.entry->state->fail(unit.error);
    return;
  }
  const OpSpec& spec = opSpec(unit.type);
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
