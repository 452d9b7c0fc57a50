// The backend's own collectives (Gloo or NCCL through a c10d ProcessGroup).
// Implemented in csrc/torch; the core uses it for the `native` reducer and for
// broadcast/barrier. Calls are made from the executor thread only, in the same
// order on every rank. Each host-memory call blocks until done or throws
// CollectiveError (the backend's own timeout bounds it).
//
// On device memory (device tensors: NCCL on CUDA) the *OnDevice calls are
// ordered on the device's engine stream instead, and the host need not wait
// for them. An implementation without a device group takes no device
// memory, and device tensors are then staged through the host.
#pragma once

#include <cstddef>
#include <vector>

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

  // True if allreduceOnDevice() and reducescatterOnDevice() take memory of
  // `device` with this dtype and op. The answer is the same on every rank
  // (ranks agree on the device kind, dtype and op of every unit), and the
  // first call for a device may be a collective (NCCL checks that no two
  // ranks share a GPU): call it at the same point on every rank, as the
  // executor does.
  virtual bool reducesOnDevice(Device& /*device*/, DataType /*dtype*/, ReduceOp /*op*/) { return false; }
  // Reduces data[0 .. count), memory of `device`, across ranks: after the
  // work enqueued so far on the device's engine stream, and before any
  // enqueued on it afterwards. Only where reducesOnDevice() said so.
  virtual void allreduceOnDevice(Device& device, void* data, size_t count, DataType dtype, ReduceOp op);
  // Reduces in[0 .. size * block_count) across ranks and leaves block
  // `rank` of the result in out[0 .. block_count); in and out do not
  // overlap. Ordered as allreduceOnDevice(), where reducesOnDevice() said so.
  virtual void reducescatterOnDevice(Device& device, const void* in, void* out, size_t block_count, DataType dtype,
                                     ReduceOp op);

  // True if broadcastOnDevice(), allgatherOnDevice() and alltoallOnDevice() take memory of
  // `device`; the same rules as reducesOnDevice().
  virtual bool movesOnDevice(Device& /*device*/) { return false; }
  // Broadcasts data[0 .. bytes) from `root`, ordered as allreduceOnDevice().
  virtual void broadcastOnDevice(Device& device, void* data, size_t bytes, int root);
  // Every rank's in[0 .. block_bytes) into out: rank r's block at
  // out + r * block_bytes (equal blocks; in and out do not overlap).
  // Ordered as allreduceOnDevice().
  virtual void allgatherOnDevice(Device& device, const void* in, void* out, size_t block_bytes);
  // Sends in's consecutive blocks of send_bytes[r] bytes to rank r and
  // receives rank r's block for this rank, recv_bytes[r] bytes, into out, in
  // rank order. A collective even where this rank sends and receives
  // nothing. Ordered as allreduceOnDevice().
  virtual void alltoallOnDevice(Device& device, const void* in, void* out, const std::vector<size_t>& send_bytes,
                                const std::vector<size_t>& recv_bytes);
};

}  // namespace hvdtorch
