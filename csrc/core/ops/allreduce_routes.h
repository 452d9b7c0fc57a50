// The device calibration's probe of each all-reduce route, which the
// all-reduce hands its Router (algorithms/router.h) with every query: the
// router decides, and runs the probe only while it calibrates (staging
// through the host is the ops', ops/allreduce_staged.h).
#pragma once

#include "algorithms/router.h"
#include "engine/execution/executor.h"

namespace hvdtorch::ops {

// One float32 Sum all-reduce by a route on the executor's context, returning
// once the device has finished it (DeviceRouter::RunRoute). On the executor
// thread.
DeviceRouter::RunRoute routeProbe(Executor& ex);

}  // namespace hvdtorch::ops
