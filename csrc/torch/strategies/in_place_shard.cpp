#include "gradients/shard_range.h"
#include "strategies/engine_ops.h"
#include "strategies/registry.h"

namespace hvdtorch {

namespace {

class InPlaceShard : public BucketStrategy {
 public:
  const char* name() const override { return "in_place_shard"; }
  bool keepsGradients() const override { return false; }
  bool registeredBuckets() const override { return true; }
  std::unique_ptr<BucketOp> launch(const StrategyContext& ctx, const ReducerBucket& bucket,
                                   const std::string& name) override {
    ops::AllreduceOptions o = ctx.allreduce;  // a registered bucket in place: the engine's registered reducer
    o.fuse = false;  // a fused unit would go through the fusion buffer, which grows to a bucket for good
    const ShardRange mine = shardRange(bucket.flat.numel(), ctx.set_rank, ctx.set_size);
    at::Tensor shard = bucket.flat.narrow(0, mine.start, mine.end - mine.start);
    return std::make_unique<EngineOp>(allreduceInPlace(*ctx.engine, std::move(o), bucket.flat, name),
                                      [shard](const std::vector<at::Tensor>&) { return shard; });
  }
};

}  // namespace

std::unique_ptr<BucketStrategy> makeInPlaceShard() { return std::make_unique<InPlaceShard>(); }

}  // namespace hvdtorch
