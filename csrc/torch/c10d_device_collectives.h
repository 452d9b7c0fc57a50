// The backend's collectives on device memory: a c10d process group of the
// device's own backend (NCCL for CUDA tensors, torch.distributed's process
// group), behind NativeCollectives' *OnDevice calls: the all-reduce, the
// reduce-scatter, the broadcast, the all-gather and the all-to-all.
//
// Which devices it serves, decided the same way on every rank:
//  * CUDA, through NCCL. The collective runs on a side stream that waits on
//    the engine stream and that the engine stream then waits on (events, so
//    the host never waits). NCCL refuses two ranks on one GPU, so the first
//    call for a CUDA device compares the GPUs' UUIDs across ranks over the
//    host group: if any two ranks share a GPU it serves no unit (they are
//    staged through the host), and says so once.
//  * The simulated device (HVDTORCH_SIM_DEVICE=1; the device group is then
//    Gloo): the data goes through pinned host memory and the group's CPU
//    collectives. It stands in for NCCL so that the engine's device-native
//    path, the group's creation and the reducer choice all run in CI.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <functional>
#include <map>
#include <memory>

#include "device/device.h"
#include "engine/execution/host_staging.h"

namespace hvdtorch {

class C10dDeviceCollectives {
 public:
  // `device_pg`: the device backend's group over every rank; `host_pg`: a
  // CPU (Gloo) group over the same ranks, for the GPU-sharing check.
  C10dDeviceCollectives(c10::intrusive_ptr<c10d::ProcessGroup> device_pg,
                        c10::intrusive_ptr<c10d::ProcessGroup> host_pg);
  ~C10dDeviceCollectives();
  C10dDeviceCollectives(const C10dDeviceCollectives&) = delete;
  C10dDeviceCollectives& operator=(const C10dDeviceCollectives&) = delete;

  bool reduces(Device& device, DataType dtype, ReduceOp op);
  void allreduce(Device& device, void* data, size_t count, DataType dtype, ReduceOp op);
  void reducescatter(Device& device, const void* in, void* out, size_t block_count, DataType dtype, ReduceOp op);
  bool moves(Device& device);
  void broadcast(Device& device, void* data, size_t bytes, int root);
  void allgather(Device& device, const void* in, void* out, size_t block_bytes);
  void alltoall(Device& device, const void* in, void* out, const std::vector<size_t>& send_bytes,
                const std::vector<size_t>& recv_bytes);
  // Collectives run so far in this process (tests check the path was taken).
  static uint64_t runs() { return runs_.load(); }

 private:
  // Reads in[0 .. in_bytes), writes out[0 .. out_bytes) (in == out: in place).
  using Collective = std::function<void(void* in, void* out, const at::Device& where)>;
  bool usable(Device& device);  // a collective on its first call for `device`
  // Runs `collective` on device memory as the header says.
  void run(Device& device, const char* what, const void* in, size_t in_bytes, void* out, size_t out_bytes,
           const Collective& collective);
  void runStaged(Device& device, const void* in, size_t in_bytes, void* out, size_t out_bytes,
                 const Collective& collective);
  void runOnSideStream(Device& device, const void* in, void* out, const Collective& collective);

  c10::intrusive_ptr<c10d::ProcessGroup> device_pg_;
  c10::intrusive_ptr<c10d::ProcessGroup> host_pg_;
  std::map<Device*, bool> usable_;
  StagingPool bounce_;  // the simulated device's host copies
  struct Side;          // CUDA: the stream NCCL runs on, and its events
  std::map<Device*, std::unique_ptr<Side>> side_;
  static std::atomic<uint64_t> runs_;
};

}  // namespace hvdtorch
