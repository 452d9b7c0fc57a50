#include "device/device.h"

#include "common/error.h"

namespace hvdtorch {

const char* deviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu: return "cpu";
    case DeviceKind::kCuda: return "cuda";
    case DeviceKind::kSim: return "sim";
  }
  return "device?";
}

std::string DeviceId::str() const {
  switch (kind) {
    case DeviceKind::kCpu: return "cpu";
    case DeviceKind::kCuda: return "cuda:" + std::to_string(index);
    case DeviceKind::kSim: return "sim:" + std::to_string(index);
  }
  return "device?";
}

namespace {
[[noreturn]] void notSupported(const Device& d, const char* what) {
  throw CollectiveError(strCat(d.id().str(), ": ", what, " is not supported on this device"));
}
}  // namespace

void Device::registerHost(void*, size_t) {}
void Device::unregisterHost(void*) {}

IpcMemoryHandle Device::exportMemory(void*) { notSupported(*this, "exportMemory (interprocess memory)"); }
void* Device::openMemory(const IpcMemoryHandle&) { notSupported(*this, "openMemory (interprocess memory)"); }
void Device::closeMemory(void*) { notSupported(*this, "closeMemory (interprocess memory)"); }
IpcEventHandle Device::exportEvent(Event&) { notSupported(*this, "exportEvent (interprocess events)"); }
std::unique_ptr<Event> Device::openEvent(const IpcEventHandle&) {
  notSupported(*this, "openEvent (interprocess events)");
}
void Device::writeFlag(void*, uint32_t, Stream*) { notSupported(*this, "writeFlag (stream flags)"); }
void Device::waitFlag(const void*, uint32_t, Stream*) { notSupported(*this, "waitFlag (stream flags)"); }

std::shared_ptr<Event> drainEngineStream(Device& device) {
  std::shared_ptr<Event> done = device.newEvent();
  device.record(*done, nullptr);
  device.synchronize(*done);
  return done;
}

}  // namespace hvdtorch
