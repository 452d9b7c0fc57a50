// The backend's own all-reduce (Gloo's ring/halving-doubling, NCCL), used as
// the baseline and as the fallback where our transports do not apply. Dtypes
// the backend cannot reduce (bool on Gloo, for instance) go through a ring.
#pragma once

#include "algorithms/reducer.h"
#include "algorithms/ring_allreduce.h"

namespace hvdtorch {

class NativeAllreduce : public Reducer {
 public:
  explicit NativeAllreduce(RingOptions fallback = {}) : fallback_(fallback) {}
  const char* name() const override { return "native"; }
  void allreduce(Context& ctx, void* data, size_t count, DataType dtype, ReduceOp op) override;
  // Its cost model describes the backend's own all-reduce, so `auto` picks it
  // only where the backend reduces the dtype itself.
  bool autoCandidate(const Context& ctx, DataType dtype, ReduceOp op) const override;
  // As a ring over the ranks in order: Gloo's default CPU all-reduce, a flat ring.
  LinkTraffic linkTraffic(const Context& ctx) const override { return fallback_.linkTraffic(ctx); }
  // The fallback ring's, for the dtypes the backend cannot reduce.
  std::map<std::string, int64_t> settings() const override { return fallback_.settings(); }

 private:
  RingAllreduce fallback_;
};

}  // namespace hvdtorch
