// The executor's fusion buffer: where a fused unit's pieces are packed to
// travel as one tensor (engine/negotiation/fusion_plan.h forms the units).
#pragma once

#include <atomic>
#include <cstdlib>
#include <memory>

#include "engine/execution/host_staging.h"
#include "transport/shm/registered_memory.h"

namespace hvdtorch {

class Device;

// A persistent buffer reused by every fused unit ("register once"): it only
// grows, and is 64-byte aligned so kernels vectorise. With registered memory
// it lives there, so the node reducer reduces fused units in place. Device
// tensors are staged through it: reserve(bytes, &device) also pins it for
// that device's kind, once per allocation (unpinned before it is freed).
class FusionBuffer {
 public:
  explicit FusionBuffer(std::shared_ptr<RegisteredMemory> registered = nullptr) : registered_(std::move(registered)) {}
  ~FusionBuffer() { pinning_.unpinAll(); }  // before storage_ goes
  void* reserve(size_t bytes, Device* pin_for = nullptr);
  // Bytes of the buffer now; any thread may ask (the executor's thread grows it).
  size_t capacity() const { return capacity_.load(std::memory_order_relaxed); }

 private:
  std::shared_ptr<RegisteredMemory> registered_;
  std::shared_ptr<void> storage_;
  std::atomic<size_t> capacity_{0};
  HostPinning pinning_;
};

}  // namespace hvdtorch
