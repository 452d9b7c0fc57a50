// Fusion planning: turns one cycle's ready responses into work units. Runs on
// every rank over the same response list, so every rank forms the same units.
//
// Consecutive tensors of ops that fuse (their op table row says so: the
// all-reduce, whose ReduceArgs this compares) with the same dtype, reduce op,
// scale factors and reducer are packed into one unit while the unit stays within
// the fusion threshold (a tensor larger than the threshold runs alone). Each
// unit then costs one collective instead of one per tensor.
#pragma once

#include <atomic>
#include <cstdlib>
#include <memory>
#include <vector>

#include "engine/execution/entry.h"
#include "engine/execution/host_staging.h"
#include "engine/request.h"
#include "transport/shm/registered_memory.h"

namespace hvdtorch {

struct ReadyOp {
  Response response;
  EntryPtr entry;  // null when this rank has no such op (only for error responses)
};

// Moves each response's plan into its unit, and gives the unit its op's row.
std::vector<WorkUnit> planWork(std::vector<ReadyOp>& ready, size_t fusion_threshold);

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
