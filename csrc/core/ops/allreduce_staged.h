// The all-reduce of device memory staged through the host: the core of the
// all-reduce's staged path (ops/allreduce.cc), also timed by the device
// calibration (algorithms/device_router.h) on a scratch buffer, through the
// staged run ops/allreduce.cc hands the router (AllreduceQuery::run_staged).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/execution/executor.h"

namespace hvdtorch::ops {

// One tensor's share of a staged all-reduce: elements [at, end) of the
// fused buffer, read from `in` and written back to `out` (may alias) on
// `device`, whose ready event the caller has already waited on.
struct StagedPart {
  Device* device;
  const void* in;
  void* out;
  size_t at, end;
};

struct StagedScaling {
  double prescale = 1.0;
  double postscale = 1.0;
  int64_t divisor = 1;  // Average's divisor (Executor::averageDivisor); 1 for the other ops
};

// Reduces `count` elements held by `parts` (ends ascending, covering
// [0, count)) through the pinned fusion buffer, by segments of
// ExecutorOptions::staging_segment_bytes: all copies to the host are
// enqueued at once, with an event after each segment's; segment s is then
// scaled, reduced by `reducer` (one collective per segment, the same
// segments on every rank) and copied back while the device still copies
// segments s + 1, ... to the host. Prescale and postscale run on the host,
// one pass each per segment. Adasum's dot products span whole tensors: it
// runs as one segment. `mark(phase, begin)` brackets the copies in and the
// reduction. Returns, per device, an event after its last copy back, which
// the host has waited for (the fusion buffer is reused by the next unit).
std::map<Device*, std::shared_ptr<Event>> reduceStaged(Executor& ex, const std::vector<StagedPart>& parts,
                                                       Reducer& reducer, DataType dtype, size_t count, ReduceOp op,
                                                       const StagedScaling& scaling,
                                                       const std::function<void(const std::string&, bool)>& mark);

}  // namespace hvdtorch::ops
