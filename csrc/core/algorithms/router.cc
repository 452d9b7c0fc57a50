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
    const DevicePath path = devices_.path(*q.device, q.asked, q.dtype, q.op, q.bytes, q.run_staged, q.calibrating);
    if (path.device) return {path.device, path.ring, false, nullptr};
    // Staged through the host reducer the device calibration measured
    // fastest staged, where it measured.
    if (path.host != kAutoReducer) return {nullptr, nullptr, false, &reducers_.get(path.host)};
  }
  if (q.on_device && one_rank) return {nullptr, nullptr, true, nullptr};
  return {nullptr, nullptr, false, &reducers_.pick(q.asked, ctx_, q.bytes, q.dtype, q.op)};
}

}  // namespace hvdtorch
