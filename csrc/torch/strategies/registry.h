// The per-bucket strategies of GradientReducer (strategies/bucket_strategy.h),
// chosen per reducer by name, one file each in this folder:
//  * "allreduce_views": the bucket is all-reduced in place; each .grad is a
//    view of its slot, so the average lands in .grad with no copy. The
//    result is the whole bucket. DistributedModel, DistributedOptimizer and
//    the sharded optimizer's shard=1.
//  * "in_place_shard": the bucket (registered memory) is all-reduced in
//    place by the registered reducer, never fused (the node reducer reads the
//    peers' buffers and writes each reduced slice back: nothing is copied
//    or allocated); the result is a view of this rank's shard range of the
//    bucket (gradients/shard_range.h). The sharded optimizer's shard=2 when
//    every rank is on one host.
//  * "reduce_scatter_shard": the bucket is reduce-scattered; the result is
//    this rank's shard, in a tensor the engine makes. shard=2 otherwise.
//  * "powersgd": low-rank compression with error feedback, two phases per
//    bucket (powersgd.h); the name gives the default options,
//    hvd.Compression.powersgd(...) hands the reducer an instance of its own.
//  * "adasum": the bucket is all-reduced in place with op Adasum as one op
//    whose tensors are the bucket's slots, each combined on its own (Adasum's
//    coefficients are dot products over one tensor: a fused bucket would give
//    other values). The result is the whole bucket. The Adasum optimizer's
//    deltas (GradientReducer::reduceNow()).
// A new strategy is one file here with its class and factory, the factory
// declared below and one row in makeBucketStrategy() (docs/architecture.md,
// "Recipes").
#pragma once

#include <memory>
#include <string>

#include "strategies/bucket_strategy.h"

namespace hvdtorch {

// The strategy named `name`; InvalidArgument naming the known ones otherwise.
std::unique_ptr<BucketStrategy> makeBucketStrategy(const std::string& name);

// Each strategy's factory, in its own file.
std::unique_ptr<BucketStrategy> makeAllreduceViews();
std::unique_ptr<BucketStrategy> makeInPlaceShard();
std::unique_ptr<BucketStrategy> makeReduceScatterShard();
std::unique_ptr<BucketStrategy> makeAdasumPerTensor();

}  // namespace hvdtorch
