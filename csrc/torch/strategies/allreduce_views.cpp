#include "strategies/engine_ops.h"
#include "strategies/registry.h"

namespace hvdtorch {

namespace {

class AllreduceViews : public BucketStrategy {
 public:
  const char* name() const override { return "allreduce_views"; }
  bool keepsGradients() const override { return true; }
  bool registeredBuckets() const override { return true; }
  std::unique_ptr<BucketOp> launch(const StrategyContext& ctx, const ReducerBucket& bucket,
                                   const std::string& name) override {
    return allreduceBucket(ctx, bucket, name);
  }
};

}  // namespace

std::unique_ptr<BucketStrategy> makeAllreduceViews() { return std::make_unique<AllreduceViews>(); }

}  // namespace hvdtorch
