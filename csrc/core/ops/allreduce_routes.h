// Which route an all-reduce of device tensors takes, as the ops ask it: the
// executor's Router (algorithms/router.h) decides, and this
// file supplies the device calibration's probe of each route (staging
// through the host is the ops', ops/allreduce_staged.h).
#pragma once

#include "algorithms/router.h"
#include "engine/execution/executor.h"

namespace hvdtorch::ops {

// The route of an all-reduce of `bytes` of `dtype`/`op` (the reduced op)
// on `device` for reducer `asked`: Router::devicePath on the executor's
// router, with ops' probe. May run the calibration (a collective). On the
// executor thread.
DevicePath devicePath(Executor& ex, Device& device, ReducerId asked, DataType dtype, ReduceOp op, size_t bytes);

}  // namespace hvdtorch::ops
