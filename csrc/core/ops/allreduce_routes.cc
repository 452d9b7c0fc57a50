#include "ops/allreduce_routes.h"

#include "algorithms/reducer_registry.h"
#include "engine/execution/host_staging.h"
#include "ops/allreduce_staged.h"

namespace hvdtorch::ops {

namespace {

// One float32 Sum all-reduce of buf[0 .. count) by `route`; returns once
// the device has finished it (the engine stream drained).
void runRoute(Executor& ex, Device& d, DeviceRoute route, void* buf, size_t count) {
  switch (route) {
    case DeviceRoute::kNative:
      ex.ctx().native()->allreduceOnDevice(d, buf, count, DataType::kFloat32, ReduceOp::kSum);
      break;
    case DeviceRoute::kRing: ex.router().ring(d)->allreduce(buf, count, DataType::kFloat32, ReduceOp::kSum); break;
    case DeviceRoute::kStaged: {
      const size_t bytes = count * sizeof(float);
      Reducer& host = ex.router().reducers().resolve(kAutoReducer, ex.ctx(), bytes, DataType::kFloat32, ReduceOp::kSum);
      reduceStaged(ex, {{&d, buf, buf, 0, count}}, host, DataType::kFloat32, count, ReduceOp::kSum, {},
                   [](const std::string&, bool) {});
      break;
    }
  }
  d.synchronize(*drainEngineStream(d));
}

}  // namespace

DeviceRouter::RunRoute routeProbe(Executor& ex) {
  return [&ex](DeviceRoute route, Device& dev, void* buf, size_t count) { runRoute(ex, dev, route, buf, count); };
}

}  // namespace hvdtorch::ops
