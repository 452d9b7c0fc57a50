#include "device/devices.h"

#include <map>
#include <mutex>
#include <utility>

#include "common/error.h"
#include "device/sim_device.h"

namespace hvdtorch {

namespace {

struct Registry {
  std::mutex mu;
  std::map<DeviceKind, DeviceMaker> makers;
  std::map<std::pair<DeviceKind, int>, std::unique_ptr<Device>> made;

  Registry() {
    makers[DeviceKind::kSim] = [](int index) {
      SimOptions o = SimOptions::fromEnv();
      o.index = index;
      return makeSimDevice(o);
    };
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void setDeviceMaker(DeviceKind kind, DeviceMaker maker) {
  if (kind == DeviceKind::kCpu) throw InvalidArgument("setDeviceMaker: the CPU device is built in");
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (maker) {
    r.makers[kind] = std::move(maker);
  } else {
    r.makers.erase(kind);
  }
}

bool deviceKindAvailable(DeviceKind kind) {
  if (kind == DeviceKind::kCpu) return true;
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  return r.makers.count(kind) != 0;
}

Device& deviceFor(DeviceId id) {
  if (id.kind == DeviceKind::kCpu) return cpuDevice();
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto& slot = r.made[{id.kind, id.index}];
  if (!slot) {
    auto maker = r.makers.find(id.kind);
    if (maker == r.makers.end())
      throw InvalidArgument(strCat(id.str(), ": this build of hvdtorch has no ", deviceKindName(id.kind), " device"));
    slot = maker->second(id.index);
  }
  return *slot;
}

}  // namespace hvdtorch
