#include "strategies/engine_ops.h"
#include "strategies/registry.h"
#include "tensor_binding.h"

namespace hvdtorch {

namespace {

// Adasum's coefficients come from dot products over one tensor, so a bucket
// fused into one vector would give other values: one op whose tensors are
// the bucket's slots, each reduced on its own (the engine never fuses Adasum).
// Otherwise as allreduce_views: in place, the whole bucket comes back.
class AdasumPerTensor : public BucketStrategy {
 public:
  const char* name() const override { return "adasum"; }
  bool keepsGradients() const override { return true; }
  bool registeredBuckets() const override { return false; }  // no in-place node reducer for Adasum
  std::unique_ptr<BucketOp> launch(const StrategyContext& ctx, const ReducerBucket& bucket,
                                   const std::string& name) override {
    ops::AllreduceOptions o = ctx.allreduce;
    o.name = name;
    o.op = ReduceOp::kAdasum;
    OpBinding binding(strCat("rank ", ctx.engine->topo().rank, ": allreduce '", name, "'"));
    for (size_t s = 0; s < bucket.params.size(); ++s) {
      int64_t numel = 1;
      for (int64_t d : bucket.shapes[s]) numel *= d;
      TensorPtr slot = binding.bind(bucket.flat.narrow(0, bucket.offsets[s], numel));
      o.inputs.push_back(slot);
      o.outputs.push_back(std::move(slot));
    }
    const int64_t handle = ops::allreduce(*ctx.engine, std::move(o));
    auto state = ctx.engine->state(handle);
    ctx.engine->release(handle);
    at::Tensor flat = bucket.flat;
    return std::make_unique<EngineOp>(std::move(state), [flat](const std::vector<at::Tensor>&) { return flat; });
  }
};

}  // namespace

std::unique_ptr<BucketStrategy> makeAdasumPerTensor() { return std::make_unique<AdasumPerTensor>(); }

}  // namespace hvdtorch
