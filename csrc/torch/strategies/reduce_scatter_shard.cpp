#include "ops/reducescatter.h"
#include "strategies/engine_ops.h"
#include "strategies/registry.h"
#include "tensor_binding.h"

namespace hvdtorch {

namespace {

class ReduceScatterShard : public BucketStrategy {
 public:
  const char* name() const override { return "reduce_scatter_shard"; }
  bool keepsGradients() const override { return false; }
  // The engine copies a reduce-scatter's input into its fusion buffer whatever memory it is in.
  bool registeredBuckets() const override { return false; }
  std::unique_ptr<BucketOp> launch(const StrategyContext& ctx, const ReducerBucket& bucket,
                                   const std::string& name) override {
    ops::ReducescatterOptions o;
    o.name = name;
    o.op = ctx.allreduce.op;
    o.prescale = ctx.allreduce.prescale;
    o.postscale = ctx.allreduce.postscale;
    o.process_set_id = ctx.allreduce.process_set_id;
    OpBinding binding(strCat("rank ", ctx.engine->topo().rank, ": reducescatter '", name, "'"));
    o.inputs = {binding.bind(bucket.flat)};
    o.allocate = binding.allocatorLike(bucket.flat);
    const int64_t handle = ops::reducescatter(*ctx.engine, std::move(o));
    auto state = ctx.engine->state(handle);
    ctx.engine->release(handle);
    return std::make_unique<EngineOp>(std::move(state),
                                      [](const std::vector<at::Tensor>& outputs) { return outputs.at(0); });
  }
};

}  // namespace

std::unique_ptr<BucketStrategy> makeReduceScatterShard() { return std::make_unique<ReduceScatterShard>(); }

}  // namespace hvdtorch
