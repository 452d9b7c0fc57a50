// Gradient reduction driven by autograd: the gradient core's one reducer,
// under DistributedModel, DistributedOptimizer (training/gradient_sync.py),
// the sharded optimizer (zero/gradients.py) and the Adasum optimizer
// (training/adasum_optimizer.py, in the deltas mode below).
//
// Contract (modelled on c10d's Reducer):
//  * A pre-hook on each parameter's gradient accumulator runs before the
//    gradient is accumulated into .grad. The first one of a backward pass
//    counts the pass with the pass counter (gradients/pass_counter.h: the
//    reducer's own cyclic one, or a strict one the caller shares, whose
//    PassLimitError leaves .grad untouched) and refuses a sparse gradient
//    when the options say so.
//  * A post-hook on each accumulator fires once the parameter's .grad is
//    final for this backward pass. The hook copies the gradient into the
//    parameter's slot of its bucket -- or, when .grad is already a view into
//    that slot (every pass after the first), copies nothing -- and, when
//    pipelining, hands a bucket to the strategy the moment its last gradient
//    is written, while backward goes on.
//  * What happens to a bucket is the reducer's strategy's
//    (strategies/bucket_strategy.h, one for all buckets): all-reduced in place, or
//    reduced into this rank's shard. A strategy that drops gradients makes
//    .grad undefined when the bucket launches.
//  * Buckets hold parameters of one dtype; their layout is given by the
//    caller (same on every rank) and can be rebuilt from the observed ready
//    order. Parameters are packed in the order given by the one packing
//    rule (gradients/bucket_packing.h), which the sharded optimizer's flat
//    parameters follow too. Bucket tensors are allocated once
//    per layout and reused; host buckets live in registered memory when the
//    strategy reduces them in place.
//  * With views on, .grad becomes a view into the bucket, so the reduced
//    result needs no copy back. When the codec puts a bucket's dtype on the
//    wire in another one (fp16 compression, gradients/wire_codec.h), the
//    bucket is the wire dtype and grads are converted in and out instead.
//  * At the end of backward (a callback queued on the autograd engine) every
//    bucket not launched yet is launched, so every rank submits every bucket
//    and nobody hangs. A parameter that got no gradient this pass (an unused
//    branch) adds nothing: its slot carries its .grad as it stands (what
//    earlier passes accumulated when .grad was not cleared), or zeros when
//    .grad is undefined -- c10d's rule, and what one process would hold.
//    In "backward" sync mode the callback then waits
//    for all buckets, so optimizer.step() sees averaged gradients; in
//    "explicit" mode finalize() or synchronize() does the wait.
//  * Passes where reduction is off (no_sync(), or all but every
//    backward_passes_per_step-th pass) only accumulate locally. Which pass
//    reduces is the pass counter's decision.
//  * Alone in its process set the reducer asks no strategy: with scale
//    factors of product 1 and a strategy that keeps gradients, the hooks
//    leave gradients where autograd put them; otherwise, and in
//    synchronize(), the bucket is scaled in place and handed back whole.
//  * Deltas mode (ReducerMode::kDeltas, the Adasum optimizer): backward
//    passes reduce nothing and never touch .grad or the buckets. The pre-hook
//    only counts: each parameter on a counter of its own (a copy of the
//    given counter's rules), so a parameter unused in a pass does not count
//    it, and its (k+1)-th gradient raises before .grad is touched. The
//    caller's reduceNow(tensors) is the reduction and the step: each tensor
//    goes into its parameter's slot (in the wire dtype), every bucket is
//    launched in index order and waited for, each tensor gets its reduced
//    slot back (decoded), and the counters are reset. synchronize() refuses.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gradients/pass_counter.h"
#include "gradients/wire_codec.h"
#include "ops/allreduce.h"
#include "strategies/bucket_strategy.h"

namespace hvdtorch {

// The accumulator handle is std::shared_ptr<Node> in torch 2.11 and
// c10::intrusive_ptr<Node> in 2.13: take whatever this torch returns.
using AccumulatorPtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::autograd::Variable&>()));

// What backward passes do (the last point of the contract above).
enum class ReducerMode : uint8_t {
  kGradients,  // they reduce the gradients: DistributedModel, DistributedOptimizer, the sharded optimizer
  kDeltas,     // they are only counted, per parameter; reduceNow() reduces: the Adasum optimizer
};

struct GradReducerOptions {
  std::string name;                  // unique per model, same on every rank
  std::string reducer;               // as ops::AllreduceOptions::reducer
  ReduceOp op = ReduceOp::kAverage;  // Average or Sum; Adasum for the Adasum optimizer's deltas
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
  ReducerMode mode = ReducerMode::kGradients;
};

class GradientReducer {
 public:
  // `counter`: the pass counter to share with the caller (its own rules:
  // strict, k, the error's advice); null: the reducer's own, cyclic over
  // options.backward_passes_per_step. In deltas mode it only gives the
  // rules each parameter's counter copies (null: strict, the default advice).
  GradientReducer(std::shared_ptr<Engine> engine, std::vector<at::Tensor> params,
                  std::vector<std::vector<int64_t>> buckets, GradReducerOptions options,
                  std::shared_ptr<PassCounter> counter = nullptr);
  ~GradientReducer();

  // New bucket layout (each inner list: parameter indices). Current gradient
  // values are kept. Call only between iterations.
  void rebuild(const std::vector<std::vector<int64_t>>& buckets);
  // Parameter indices in the order their gradients became ready during the
  // first reduced backward pass (empty before one ran).
  std::vector<int64_t> readyOrder();
  // Launches what has not been launched and waits for every bucket; raises
  // the first error. A no-op when no reduced pass is in flight.
  void finalize();
  // Whether a reduced pass is in flight: what finalize() would wait for.
  bool reducing();
  // finalize() one bucket at a time, so that the caller can use a bucket's
  // result while later ones are still reduced (stepping the optimizer over
  // its parameters): launches what has not been launched, waits for bucket
  // `index` and puts its result into .grad. A no-op when no reduced pass is
  // in flight or that bucket was waited for already; finalize() waits for
  // the rest and ends the pass. On an error every other bucket is waited
  // for too (nothing is left running) and the pass ends. InvalidArgument
  // for a strategy that does not hand gradients back (a shard strategy) and
  // for an index out of range.
  void finishBucket(int64_t index);
  // Each bucket's parameter indices, in bucket order (the layout in use).
  std::vector<std::vector<int64_t>> bucketParams() const;
  // Every bucket's result in the parameters' dtype (the strategy's: the whole
  // bucket, or this rank's shard), then the step: the counter's reset().
  // After a reduced pass it waits for what backward launched; otherwise
  // (fewer passes, or none) it reduces what .grad holds now, zeros for a
  // parameter without one. Raises the first error.
  std::vector<at::Tensor> synchronize();
  // Deltas mode: reduces `tensors` (one per parameter, in the reducer's
  // order, each of its parameter's numel) with the strategy, in place
  // (contract above), then resets the pass counters. InvalidArgument in
  // gradients mode or for tensors that do not fit. Raises the first error.
  void reduceNow(const std::vector<at::Tensor>& tensors);
  // The counted passes, whichever mode: whether one ran since the last step,
  // forget them (a given k also sets backward_passes_per_step), change k
  // keeping them.
  bool passesPending();
  void resetPasses(std::optional<int> passes_per_step = std::nullopt);
  void setPassesPerStep(int passes_per_step);
  // Between steps: zeroes every bucket whose dtype is its parameters' and
  // makes each of their .grad a view of its slot, so that the next backward
  // accumulates in place. Buckets with a reduction in flight are left alone.
  void viewGradients();
  void setSyncEnabled(bool enabled);
  // Called once per backward pass on the autograd thread, outside the
  // reducer's lock: `at_start` when the pass begins, before anything of it
  // accumulates into .grad; `after_drop` at the end of a reduced pass whose
  // strategy dropped .grad (the shard strategies). shard=2's stand-in
  // gradients hang on them (hvdtorch/zero/held_gradients.py). Set before
  // the first backward pass.
  void setPassCallbacks(std::function<void()> at_start, std::function<void()> after_drop);
  const std::shared_ptr<PassCounter>& counter() const { return counter_; }
  std::vector<at::Tensor> flats() const;
  int64_t bucketCount() const { return static_cast<int64_t>(buckets_.size()); }
  // Bytes of each bucket, for tests and logs.
  std::vector<int64_t> bucketBytes() const;

 private:
  struct Bucket {
    at::Tensor flat;               // persistent storage of the bucket
    std::vector<int64_t> params;   // indices into params_
    std::vector<int64_t> offsets;  // element offset of each param in flat
    bool views = false;            // grads are views into flat
    int pending = 0;               // params not ready yet this pass
    bool launched = false;
    std::unique_ptr<BucketOp> op;  // the strategy's reduction in flight
  };

  void beforeGrad(size_t index, const torch::autograd::variable_list& grads);
  void onGradReady(size_t index);
  // Deltas mode: parameter `index` got its gradient of a pass.
  void countParameterPass(size_t index);
  // The parameter's name for errors.
  std::string paramName(size_t index) const;
  void startPass();
  // synchronize() with no reduced pass in flight: every slot is written afresh.
  void startReductionNow();
  // Puts the parameter's .grad (zeros when undefined) into its slot and, with
  // views, makes .grad that slot.
  void writeSlot(Bucket& b, size_t slot);
  void launch(size_t bucket);
  void launchRemaining();
  // Finishes every launched bucket; returns the results (undefined where
  // nothing was launched) after the codec's decode.
  std::vector<at::Tensor> waitAll();
  at::Tensor decode(Bucket& b, const at::Tensor& result);
  void endOfBackward();
  at::Tensor slotView(const Bucket& b, size_t slot) const;
  // What the strategy sees of bucket `index`.
  ReducerBucket strategyView(size_t index) const;

  std::shared_ptr<Engine> engine_;
  int set_size_ = 1;  // ranks that average these gradients (the process set's size)
  std::vector<at::Tensor> params_;
  GradReducerOptions opts_;
  std::shared_ptr<BucketStrategy> strategy_;
  StrategyContext ctx_;         // what every bucket launch shares
  bool lone_identity_ = false;  // alone in the set, scale factors of product 1, gradients kept: nothing to do
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // param index -> bucket
  std::vector<size_t> slot_of_;    // param index -> position in its bucket
  std::vector<bool> ready_;
  std::vector<int64_t> ready_order_;
  bool recorded_order_ = false;
  int generation_ = 0;  // layout version, part of bucket names

  std::mutex mu_;
  bool pass_active_ = false;
  bool pass_ended_ = false;  // backward finished, results not yet waited for
  bool reduce_this_pass_ = false;
  // A reduced pass is in flight (its buckets may still be launched or waited for); mu_ held.
  bool reducingLocked() const { return pass_active_ && reduce_this_pass_; }
  std::function<void()> at_pass_start_;      // setPassCallbacks
  std::function<void()> after_grads_drop_;   // setPassCallbacks
  std::shared_ptr<PassCounter> counter_;     // setSyncEnabled(false) makes passes local (uncounted)
  std::vector<PassCounter> param_counters_;  // deltas mode: one per parameter, counter_'s rules

  // Hooks are removed in the destructor; holding the accumulators keeps the
  // nodes (and so the hooks) alive as long as this reducer.
  std::vector<AccumulatorPtr> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  std::vector<const torch::autograd::FunctionPreHook*> pre_hooks_;
};

}  // namespace hvdtorch
