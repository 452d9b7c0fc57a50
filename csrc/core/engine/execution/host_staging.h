// Host memory the executor stages device tensors through, for the ops and
// reducers that have no device path (the device group, the device ring and
// the one-rank all-reduce keep device tensors on the device:
// algorithms/device_router.h). A staged device op runs as: the
// engine stream waits on the tensors' ready events, copies them to pinned
// host memory here, the op runs on the host copies exactly as it runs on
// CPU tensors, and its outputs are copied back to device memory before the
// op completes (engine/execution/executor.h: Executor::complete).
//
// Pinning: staging memory is registered with the device once, when it is
// made (cudaHostRegister is slow: never per op), and unregistered before it
// is freed. The registration is per device kind: CUDA registers host memory
// for every GPU of the process at once (portable), and so does the
// simulated device's table.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <vector>

#include "device/device.h"
#include "engine/tensor.h"

namespace hvdtorch {

// Registers host ranges with devices, once per (range, device kind), and
// unregisters them when told or when destroyed.
class HostPinning {
 public:
  HostPinning() = default;
  HostPinning(const HostPinning&) = delete;
  HostPinning& operator=(const HostPinning&) = delete;
  ~HostPinning() { unpinAll(); }
  // Registers [base, base + bytes) with `device`'s kind unless it already is.
  void pin(void* base, size_t bytes, Device& device);
  void unpinAll();

 private:
  struct Range {
    void* base;
    std::map<DeviceKind, Device*> devices;  // the device each kind registered it with
  };
  std::vector<Range> ranges_;
};

// Pinned host blocks handed out for one unit at a time: take() bump-allocates
// (64-byte aligned) from chunks that are kept across units, so steady-state
// staging registers nothing. Blocks stay valid until reset(), which the
// executor calls when a unit is done; a unit that needed more than one chunk
// leaves one chunk of the total size for the next.
class StagingPool {
 public:
  StagingPool() = default;
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;
  ~StagingPool();
  void* take(size_t bytes, Device& device);
  void reset();

 private:
  struct Chunk {
    std::shared_ptr<void> memory;
    size_t size = 0;
  };
  void addChunk(size_t bytes);
  std::vector<Chunk> chunks_;
  size_t current_ = 0;  // chunk being filled
  size_t used_ = 0;     // bytes taken from it
  size_t total_ = 0;    // bytes taken this unit
  HostPinning pinning_;
};

// A host view of staging memory, shaped as the device tensor it stands for.
class StagedTensor : public TensorBuffer {
 public:
  StagedTensor(void* data, DataType dtype, std::vector<int64_t> shape);
  void* data() override { return data_; }
  DataType dtype() const override { return dtype_; }
  std::vector<int64_t> shape() const override { return shape_; }
  int64_t numel() const override { return numel_; }

 private:
  void* data_;
  DataType dtype_;
  std::vector<int64_t> shape_;
  int64_t numel_;
};

// Waits `device`'s engine stream on the ready event of each tensor (each
// distinct event once).
void waitReady(Device& device, const std::vector<TensorPtr>& tensors);

struct Entry;

// One entry's device buffers, swapped for host copies while its op runs:
// stageIn() waits on the ready events, copies the inputs to pinned host
// memory (outputs that alias an input share its copy), wraps the allocator
// so that allocated outputs are made on the device with a host stand-in,
// waits for the copies and swaps the host buffers into the entry.
// stageOut() copies every output back to the device (but a HostTensor the
// op made as host metadata, which stays on the host), records the entry's
// completion event, waits for the copies (the staging memory is reused by
// the next unit), and swaps the device buffers back.
class StagedEntry {
 public:
  static std::unique_ptr<StagedEntry> stageIn(Entry& entry, StagingPool& pool);
  void stageOut(Entry& entry);

 private:
  explicit StagedEntry(Device& device) : device_(device) {}
  Device& device_;
  std::vector<TensorPtr> device_inputs_;
  std::vector<TensorPtr> device_outputs_;  // given by the caller
  // Host stand-in -> device output, for every output (given or allocated).
  std::vector<std::pair<const TensorBuffer*, TensorPtr>> outputs_;
  std::shared_ptr<struct StagedAllocations> allocated_;
};

}  // namespace hvdtorch
