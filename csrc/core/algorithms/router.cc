#include "algorithms/router.h"

#include <algorithm>

#include "algorithms/reducer_registry.h"
#include "common/error.h"

namespace hvdtorch {

Router::~Router() {
  for (auto& [device, buffer] : device_fusion_) device->release(buffer.data);
}

void* Router::deviceFusion(Device& device, size_t bytes) {
  DeviceBuffer& b = device_fusion_[&device];
  if (bytes > b.bytes) {
    device.release(b.data);  // ordered after the work enqueued on it (cudaFree, the simulated release)
    b.bytes = std::max(bytes, b.bytes * 2);
    b.data = device.allocate(b.bytes);
  }
  return b.data;
}

AllreduceRoute Router::route(const AllreduceQuery& q) {
  static const ReducerId native = parseReducer("native");
  const bool one_rank = ctx_.size() == 1;
  if (q.on_device && DeviceRouter::hasDeviceRoutes(q.asked) && (!one_rank || q.asked == native)) {
    if (!q.device) throw CollectiveError(q.several_devices);
    // The staged route as `auto` would stage it: through the host reducer
    // the cost model holds cheapest for the probe's size.
    DeviceRouter::RunStaged staged = [this, &q](Device& d, void* buf, size_t count) {
      Reducer& host = reducers_.resolve(kAutoReducer, ctx_, count * sizeof(float), DataType::kFloat32, ReduceOp::kSum);
      q.run_staged(d, buf, count, host);
    };
    const DevicePath path = devices_.path(*q.device, q.asked, q.dtype, q.op, q.bytes, staged, q.calibrating);
    if (path.device) return {path.device, path.ring, false, nullptr};
  }
  if (q.on_device && one_rank) return {nullptr, nullptr, true, nullptr};
  return {nullptr, nullptr, false, &reducers_.pick(q.asked, ctx_, q.bytes, q.dtype, q.op)};
}

}  // namespace hvdtorch
