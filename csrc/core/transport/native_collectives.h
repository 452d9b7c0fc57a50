// The backend's own collectives (Gloo or NCCL through a c10d ProcessGroup).
// Implemented in csrc/torch; the core uses it for the `native` reducer and for
// broadcast/barrier. Calls are made from the executor thread only, in the same
// order on every rank. Each host-memory call blocks until done or throws
// CollectiveError (the backend's own timeout bounds it).
//
// On device memory (the `native` reducer on device tensors: NCCL on CUDA)
// the calls are ordered on the device's engine stream instead, and the host
// need not wait for them. An implementation without a device group reduces
// no device memory, and device tensors are then staged through the host.
#pragma once

#include <cstddef>

#include "common/dtype.h"

namespace hvdtorch {

class Device;

class NativeCollectives {
 public:
  virtual ~NativeCollectives() = default;
  // True if the backend reduces this dtype/op pair itself.
  virtual bool supports(DataType dtype, ReduceOp op) const = 0;
  virtual void allreduce(void* data, size_t count, DataType dtype, ReduceOp op) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;

  // True if allreduceOnDevice() takes memory of `device` with this dtype and
  // op. The answer is the same on every rank (ranks agree on the device
  // kind, dtype and op of every unit), and the first call for a device may
  // be a collective (NCCL checks that no two ranks share a GPU): call it at
  // the same point on every rank, as the executor does.
  virtual bool reducesOnDevice(Device& /*device*/, DataType /*dtype*/, ReduceOp /*op*/) { return false; }
  // Reduces data[0 .. count), memory of `device`, across ranks: after the
  // work enqueued so far on the device's engine stream, and before any
  // enqueued on it afterwards. Only where reducesOnDevice() said so.
  virtual void allreduceOnDevice(Device& device, void* data, size_t count, DataType dtype, ReduceOp op);
  // The same for a broadcast of data[0 .. bytes) from `root`.
  virtual bool broadcastsOnDevice(Device& /*device*/) { return false; }
  virtual void broadcastOnDevice(Device& device, void* data, size_t bytes, int root);
};

}  // namespace hvdtorch
