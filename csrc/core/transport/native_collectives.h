// The backend's own collectives (Gloo or NCCL through a c10d ProcessGroup).
// Implemented in csrc/torch; the core uses it for the `native` reducer and for
// broadcast/barrier. Calls are made from the executor thread only, in the same
// order on every rank. Each call blocks until done or throws CollectiveError
// (the backend's own timeout bounds it).
#pragma once

#include <cstddef>

#include "common/dtype.h"

namespace hvdtorch {

class NativeCollectives {
 public:
  virtual ~NativeCollectives() = default;
  // True if the backend reduces this dtype/op pair itself.
  virtual bool supports(DataType dtype, ReduceOp op) const = 0;
  virtual void allreduce(void* data, size_t count, DataType dtype, ReduceOp op) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
};

}  // namespace hvdtorch
