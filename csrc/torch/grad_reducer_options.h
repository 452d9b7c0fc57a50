// The options of a gradient reducer (grad_reducer.h, delta_reducer.h), as
// Python fills them by name (_C.GradientReducerOptions,
// hvdtorch/training/reducer_options.py, which also decides the codec).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "gradients/wire_codec.h"
#include "strategies/bucket_strategy.h"

namespace hvdtorch {

struct GradReducerOptions {
  std::string name;                  // unique per model, same on every rank
  std::string reducer;               // as ops::AllreduceOptions::reducer
  ReduceOp op = ReduceOp::kAverage;  // Average or Sum; Adasum for the Adasum optimizer's deltas (DeltaReducer)
  double prescale = 1.0;
  double postscale = 1.0;  // the user's; Average divides by the size on top
  bool pipeline = true;
  bool sync_on_backward = true;
  bool fuse = true;  // let the engine fuse buckets ready together
  int backward_passes_per_step = 1;
  int32_t process_set_id = 0;  // the set whose members average these gradients
  // How buckets travel (gradients/wire_codec.h): a bucket is its codec's wire dtype; where that is the
  // parameters' own dtype, gradients become bucket views.
  WireCodec codec = WireCodec::kNone;
  std::string strategy = "allreduce_views";  // the buckets' strategy (strategies/registry.h)
  // Non-null: the strategy itself, made and kept by the caller (which reads
  // and restores its state: PowerSGD's); `strategy` is then ignored. One
  // reducer per instance.
  std::shared_ptr<BucketStrategy> strategy_instance;
  // Non-empty: a sparse gradient is refused (InvalidArgument naming the rank
  // and the parameter, then this advice); empty: gradients go in as they come.
  std::string sparse_refusal;
  std::vector<std::string> param_names;  // named by errors; empty: "parameter <index>"
  // The buckets hold memory only from the first gradient written into them
  // in a pass until their reduction is done (bucket_set.h): the sharded
  // optimizer's shard=3, whose gradients are then sharded at rest and, as far
  // as the reductions keep up, during backward too. Needs a strategy that
  // keeps nothing of a bucket after its op (reduce_scatter_shard).
  bool release_buckets = false;
  // Parameters that got no gradient on any rank of the set since the last
  // reduction (grad_reducer.h, "Unused everywhere"):
  //  ""        no exchange: their slots carry zeros like any locally unused one;
  //  "leave"   they keep .grad undefined, as in one process and under DDP
  //            (the optimizer skips them); a parameter counts as given a
  //            gradient where a pass used it or its .grad was defined;
  //  "report"  only use counts (the sharded optimizer's .grad are always its
  //            own views) and nothing is changed: unusedEverywhere() lists them.
  // "report" costs an all-reduce of a float per parameter per reduced pass,
  // "leave" one of a float per candidate in a pass that has any
  // (grad_reducer.h: a parameter whose reduced gradient starts with zero).
  std::string unused;
};

}  // namespace hvdtorch
