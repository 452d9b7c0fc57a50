// The flat buckets of one reducer's parameters and their reduction by one
// strategy: what the hook-driven GradientReducer (grad_reducer.h) and the
// DeltaReducer (delta_reducer.h) share.
//
// Contract:
//  * Buckets hold parameters of one dtype and one device; their layout is
//    given by the owner (the same on every rank) and may be rebuilt between
//    iterations. Parameters are packed in the order given by the one packing
//    rule (gradients/bucket_packing.h), which the sharded optimizer's flat
//    parameters follow too. Bucket tensors are allocated once per layout, in
//    the codec's wire dtype for their parameters' dtype; CPU buckets live in
//    registered memory when the strategy reduces them in place.
//  * With `grads` set (the GradientReducer), the buckets stand for the
//    parameters' .grad: where the wire dtype is the parameters' own, .grad
//    becomes a view of its slot (so the reduced result needs no copy back);
//    otherwise the reduced values are converted back into .grad, and a
//    rebuild carries .grad over into the new slots. Without it (the
//    DeltaReducer) the buckets only carry what the owner writes into them.
//  * launch() hands a bucket to the strategy (strategies/bucket_strategy.h);
//    alone in its process set nothing is exchanged: the bucket is scaled in
//    place and handed back whole. waitAll() finishes every launched bucket.
//  * Names of the ops: "<name>.g<layout generation>.b<bucket index>".
//  * release_buckets (options): a bucket's tensor exists only from hold()
//    (the first slot written in a pass, or its launch) until its result is
//    taken: by collectFinished() as soon as its op is done, or by waitAll().
//    Such buckets are never views of .grad (hooks copy into them), and a
//    result is a tensor of its own (reduce_scatter_shard's), so dropping the
//    bucket's tensor frees it.
// Not thread-safe: the owner's lock guards every call.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "grad_reducer_options.h"
#include "strategies/bucket_strategy.h"

namespace hvdtorch {

class BucketSet {
 public:
  struct Bucket {
    at::Tensor flat;  // storage of the bucket (undefined while released)
    int64_t numel = 0;
    at::TensorOptions options;  // of flat
    // The parameters' dtype when the layout was made: results are decoded into it. A parameter may hold
    // another dtype for a while (shard=3 gathers it in a mixed-precision policy's param_dtype for forward
    // and backward); its gradient is still reduced and handed back in the dtype of its master copy.
    at::ScalarType param_dtype = at::kFloat;
    at::Tensor early;  // release_buckets: the result collectFinished() took
    std::exception_ptr early_error;
    std::vector<int64_t> params;   // indices into params()
    std::vector<int64_t> offsets;  // element offset of each param in flat
    bool views = false;            // grads are views into flat
    int pending = 0;               // params not ready yet this pass (the hook reducer's count)
    bool launched = false;
    std::unique_ptr<BucketOp> op;  // the strategy's reduction in flight
  };

  // Checks the options' process set and op (InvalidArgument) and makes the
  // strategy; then rebuild(layout), and checks the options against the
  // engine with those buckets (an unknown or unavailable reducer fails here,
  // not in the first backward pass).
  BucketSet(std::shared_ptr<Engine> engine, std::vector<at::Tensor> params,
            const std::vector<std::vector<int64_t>>& layout, GradReducerOptions options, bool grads);
  // Never leaves the engine writing into buckets about to be freed: drains what is in flight.
  ~BucketSet();
  BucketSet(const BucketSet&) = delete;
  BucketSet& operator=(const BucketSet&) = delete;

  // New layout (each inner list: parameter indices). With `grads`, current
  // gradient values are kept.
  void rebuild(const std::vector<std::vector<int64_t>>& layout);
  // From now on as if built without `grads`: no bucket is a view of .grad and
  // nothing is written into .grad (the layout is rebuilt, unchanged).
  void leaveGradients();

  at::Tensor slotView(const Bucket& b, size_t slot) const;
  // release_buckets: makes the bucket's tensor (uninitialized) if it is released.
  void hold(Bucket& b);
  // release_buckets: takes the result of every launched bucket whose op is
  // done and releases its tensor (no-op otherwise). Never blocks.
  void collectFinished();
  // Hands bucket `index` to the strategy (a shard strategy drops .grad first).
  void launch(size_t index);
  // The strategy's result of `b` in the parameters' dtype; with `grads` and
  // a wire dtype, also written back into each .grad.
  at::Tensor decode(Bucket& b, const at::Tensor& result);
  // Finishes every launched bucket; returns the results (undefined where
  // nothing was launched) after decode(). Raises the first error once all are finished.
  std::vector<at::Tensor> waitAll();

  // Alone in the set with scale factors of product 1 and a strategy that
  // keeps gradients: reduction is the identity.
  bool loneIdentity() const { return lone_identity_; }
  std::vector<Bucket>& buckets() { return buckets_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  Bucket& bucketOf(size_t param) { return buckets_[bucket_of_[param]]; }
  size_t bucketIndexOf(size_t param) const { return bucket_of_[param]; }
  size_t slotOf(size_t param) const { return slot_of_[param]; }
  const std::vector<at::Tensor>& params() const { return params_; }
  const GradReducerOptions& options() const { return opts_; }
  const BucketStrategy& strategy() const { return *strategy_; }
  const std::shared_ptr<Engine>& engine() const { return engine_; }
  // Ranks that reduce these buckets, and what every bucket launch shares.
  int setSize() const { return set_size_; }
  const StrategyContext& context() const { return ctx_; }
  // The parameter's name for errors.
  std::string paramName(size_t index) const;

  std::vector<at::Tensor> flats() const;
  std::vector<std::vector<int64_t>> bucketParams() const;
  std::vector<int64_t> bucketBytes() const;

 private:
  // What the strategy sees of bucket `index`.
  ReducerBucket strategyView(size_t index) const;

  std::shared_ptr<Engine> engine_;
  std::vector<at::Tensor> params_;
  GradReducerOptions opts_;
  bool grads_;
  int set_size_ = 1;  // ranks that reduce these buckets (the process set's size)
  std::shared_ptr<BucketStrategy> strategy_;
  StrategyContext ctx_;  // what every bucket launch shares
  bool lone_identity_ = false;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // param index -> bucket
  std::vector<size_t> slot_of_;    // param index -> position in its bucket
  int generation_ = 0;             // layout version, part of bucket names
};

}  // namespace hvdtorch
