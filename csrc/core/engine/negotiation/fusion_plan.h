// Fusion planning: turns one cycle's ready responses into work units. Runs
// on the control thread (Controller::queueUnits, after negotiation) on every
// rank over the same response list, so every rank forms the same units; the
// executor runs them (engine/execution/executor.h), packing fused ones into
// its FusionBuffer (engine/execution/fusion_buffer.h).
//
// Consecutive tensors of ops that fuse (their op table row says so: the
// all-reduce, whose ReduceArgs this compares) with the same dtype, reduce op,
// scale factors and reducer are packed into one unit while the unit stays within
// the fusion threshold (a tensor larger than the threshold runs alone). Each
// unit then costs one collective instead of one per tensor.
#pragma once

#include <vector>

#include "engine/execution/entry.h"
#include "engine/request.h"

namespace hvdtorch {

struct ReadyOp {
  Response response;
  EntryPtr entry;  // null when this rank has no such op (only for error responses)
};

// Moves each response's plan into its unit, and gives the unit its op's row.
std::vector<WorkUnit> planWork(std::vector<ReadyOp>& ready, size_t fusion_threshold);

}  // namespace hvdtorch
