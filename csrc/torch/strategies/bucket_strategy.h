// What happens to one gradient bucket once its gradients are in it: the
// strategy seam of the gradient core. GradientReducer (grad_reducer.h) owns
// the hooks, the pass counting, the bucket buffers and the wire codec; a
// BucketStrategy owns the reduction of a bucket and what the caller gets back.
// Every bucket of one reducer has the same strategy.
//
// Contract:
//  * launch() is called with the reducer's lock held, on the thread of a
//    gradient hook (or of the end-of-backward callback, or of the caller of
//    synchronize()/finalize()/reduceNow()), once the bucket's buffer holds
//    this pass's gradients (for the DeltaReducer: the tensors reduceNow() was
//    handed) in the wire dtype. It submits the bucket's first op(s) and
//    returns what is in flight; it never blocks on other ranks.
//  * BucketOp::finish() is called once, under the same lock, by the thread
//    that waits for the pass. It waits, may submit further ops and wait for
//    them (a multi-phase strategy: low-rank factors reduced one after the
//    other with compute in between), and returns the bucket's result in the
//    wire dtype: the reduced bucket itself, or a part of it, or a tensor the
//    engine made. It throws CollectiveError when an op failed. The reducer
//    converts the result into the parameters' dtype (the codec's decode).
//  * BucketOp::drain() waits at most `timeout` for every op the bucket has
//    in flight, without throwing (the reducer is going away).
//  * BucketOp::done() says, without blocking, that finish() would not wait
//    (false when the op cannot tell): a reducer that releases its buckets
//    finishes those early (grad_reducer_options.h release_buckets).
//  * A strategy is only asked to launch when the process set has two or
//    more ranks; alone in its set, the reducer applies the scale factors to
//    the bucket itself and hands back the whole bucket.
//  * Per-bucket state that outlives a pass (error feedback, say) lives in
//    the strategy, indexed by ReducerBucket::index, or by
//    ReducerBucket::params where it must survive a new layout;
//    layoutChanged() is called whenever the reducer (re)builds its buckets.
//  * Every reduced pass (for the DeltaReducer, every reduceNow()) launches every
//    bucket exactly once, so a strategy can count passes by counting
//    launches.
// The strategies and the names that choose them: strategies/registry.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "ops/allreduce.h"

namespace hvdtorch {

// What a strategy sees of a bucket.
struct ReducerBucket {
  size_t index = 0;              // position in the reducer's layout
  at::Tensor flat;               // the bucket, 1-D, in the wire dtype; the same storage every pass until a rebuild
                                 // (unless the reducer releases its buckets: a new tensor each pass)
  at::ScalarType param_dtype{};  // the dtype of its parameters
  // Its parameters in slot order: index in the reducer's parameter list
  // (the same on every rank), element offset in `flat`, shape.
  std::vector<int64_t> params;
  std::vector<int64_t> offsets;
  std::vector<std::vector<int64_t>> shapes;
};

// What every launch of one reducer shares.
struct StrategyContext {
  Engine* engine = nullptr;
  // Op, scale factors, reducer, fuse and process set of the reducer's options; name and tensors empty.
  ops::AllreduceOptions allreduce;
  int set_rank = 0;  // this rank's position in the process set
  int set_size = 1;  // ranks of the process set (>= 2 when a strategy launches)
};

// One bucket's reduction in flight.
class BucketOp {
 public:
  virtual ~BucketOp() = default;
  virtual at::Tensor finish() = 0;
  virtual void drain(std::chrono::milliseconds timeout) = 0;
  virtual bool done() const { return false; }
};

class BucketStrategy {
 public:
  virtual ~BucketStrategy() = default;
  // The name that chooses it (registry.h).
  virtual const char* name() const = 0;
  // Whether each parameter's .grad stays a view of its bucket slot after the
  // launch, the reduced values written there (all-reduce); false: .grad is
  // dropped when the bucket launches (only a shard comes back).
  virtual bool keepsGradients() const = 0;
  // Whether host buckets live in registered memory (reduced in place by the
  // node reducer); false where the engine copies the bucket anyway.
  virtual bool registeredBuckets() const = 0;
  // Whether a parameter whose slot is zeros on every rank gets zeros back,
  // identical on every rank: what lets the gradient reducer find one no rank
  // gave a gradient from the results (grad_reducer.h, "Unused everywhere").
  // False where a reduction adds state of its own (PowerSGD's error feedback).
  virtual bool zerosReduceToZeros() const { return true; }
  virtual void layoutChanged(const std::vector<ReducerBucket>& /*buckets*/) {}
  // `name`: the op name of this launch, the same on every rank.
  virtual std::unique_ptr<BucketOp> launch(const StrategyContext& ctx, const ReducerBucket& bucket,
                                           const std::string& name) = 0;
};

}  // namespace hvdtorch
