#include "strategies/registry.h"

#include "common/error.h"
#include "strategies/powersgd.h"

namespace hvdtorch {

std::unique_ptr<BucketStrategy> makeBucketStrategy(const std::string& name) {
  if (name == "allreduce_views") return makeAllreduceViews();
  if (name == "in_place_shard") return makeInPlaceShard();
  if (name == "reduce_scatter_shard") return makeReduceScatterShard();
  if (name == "powersgd") return std::make_unique<PowerSGDStrategy>(PowerSGDOptions{});
  if (name == "adasum") return makeAdasumPerTensor();
  throw InvalidArgument(strCat("hvdtorch: unknown bucket strategy '", name,
                               "' (allreduce_views, in_place_shard, reduce_scatter_shard, powersgd or adasum)"));
}

}  // namespace hvdtorch
