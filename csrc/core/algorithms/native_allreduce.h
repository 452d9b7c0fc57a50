// The backend's own all-reduce (Gloo's ring/halving-doubling, NCCL), used as
// the baseline and as the fallback where our transports do not apply. Dtypes
// the backend cannot reduce (bool on Gloo, for instance) go through the ring.
#pragma once

#include "algorithms/reducer.h"
#include "algorithms/ring_allreduce.h"

namespace hvdtorch {

class NativeAllreduce : public Reducer {
 public:
  explicit NativeAllreduce(RingAllreduce* fallback) : fallback_(fallback) {}
  const char* name() const override { return "native"; }
  void allreduce(Context& ctx, void* data, size_t count, DataType dtype, ReduceOp op) override;

 private:
  RingAllreduce* fallback_;
};

}  // namespace hvdtorch
