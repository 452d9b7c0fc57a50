#include "algorithms/router.h"

#include "algorithms/reducer_registry.h"

namespace hvdtorch {

AllreduceRoute Router::route(const AllreduceQuery& q) {
  static const ReducerId native = parseReducer("native");
  const bool one_rank = ctx_.size() == 1;
  if (q.device && DeviceRouter::hasDeviceRoutes(q.asked) && (!one_rank || q.asked == native)) {
    Device& d = q.device();
    const bool deciding = devices_.calibratesNext(d, q.asked);
    if (deciding) q.calibrating(true);
    const DevicePath path = devices_.path(d, q.asked, q.dtype, q.op, q.bytes, q.probe);
    if (deciding) q.calibrating(false);
    if (path.device) return {path.device, path.ring, false, nullptr};
  }
  if (q.device && one_rank) return {nullptr, false, true, nullptr};
  return {nullptr, false, false, &reducers_.pick(q.asked, ctx_, q.bytes, q.dtype, q.op)};
}

}  // namespace hvdtorch
