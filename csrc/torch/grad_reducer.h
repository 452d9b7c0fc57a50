// Gradient reduction driven by autograd: the gradient core's reducer of
// gradients, under DistributedModel, DistributedOptimizer
// (training/gradient_sync.py) and the sharded optimizer (zero/gradients.py).
// Its buckets and their strategy are a BucketSet (bucket_set.h), which it
// shares with the DeltaReducer (delta_reducer.h) of the Adasum optimizer.
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
//  * Buckets (bucket_set.h): with views, .grad becomes a view into the
//    bucket, so the reduced result needs no copy back; with a wire dtype
//    (fp16 compression, gradients/wire_codec.h) grads are converted in and
//    out instead.
//  * At the end of backward (a callback queued on the autograd engine) every
//    bucket not launched yet is launched, so every rank submits every bucket
//    and nobody hangs. A parameter that got no gradient this pass (an unused
//    branch) adds nothing: its slot carries its .grad as it stands (what
//    earlier passes accumulated when .grad was not cleared), or zeros when
//    .grad is undefined -- c10d's rule, and what one process would hold.
//    In "backward" sync mode the callback then waits
//    for all buckets, so optimizer.step() sees averaged gradients; in
//    "explicit" mode finalize() or synchronize() does the wait.
//  * Unused everywhere (options.unused, grad_reducer_options.h): each
//    reduced pass notes one flag per parameter: whether this rank gave it a
//    gradient since the last reduction (a pass used it, or, with "leave",
//    its .grad was defined), and unusedEverywhere() lists, until the next
//    reduced pass, those no rank gave one. "report" sums every flag over the
//    set in an op started at the end of backward, as "leave" does over a
//    strategy whose results cannot tell (PowerSGD's error feedback: zeros
//    do not reduce to zeros). Otherwise "leave" looks at the results first:
//    a parameter no rank gave a gradient reduces to zeros, identical on
//    every rank, so only parameters whose first reduced element is zero
//    have their flags summed (one small op, after the buckets, in
//    the rare pass that has any; none otherwise); each of them keeps .grad
//    undefined once the results are in (finalize(), synchronize(), each
//    finishBucket(), the end of backward in "backward" mode), as c10d leaves
//    a globally unused parameter's .grad, so the optimizer skips it as in one
//    process. Alone in the set nothing is exchanged.
//    Under the traced hooks only use counts (their end of a pass gives every
//    parameter a zero gradient), and such a parameter is an InvalidArgument
//    naming it: compiled autograd writes every .grad, so None cannot stay.
//  * Passes where reduction is off (no_sync(), or all but every
//    backward_passes_per_step-th pass) only accumulate locally. Which pass
//    reduces is the pass counter's decision.
//  * Compiled autograd traces no C++ hook (accumulator_hooks.h): after
//    useTracedHooks() the caller's hooks, which it can trace, drive the
//    reducer instead (hvdtorch/training/compiled_model.py), and .grad is
//    never touched: compiled autograd writes .grad when its graph ends, so
//    the gradients come as arguments. gradientReady(i, grad) once parameter
//    i's gradient is accumulated (the first of a pass starts it) copies it
//    into its slot; backwardEnded(grads) at the end of the pass fills the
//    slots of gradients not seen (from grads, or zeros), launches the rest,
//    waits for every bucket (whatever the sync mode: the result must be in
//    grads before the graph ends) and copies the results into grads.
//  * Alone in its process set the reducer asks no strategy: with scale
//    factors of product 1 and a strategy that keeps gradients, the hooks
//    leave gradients where autograd put them; otherwise, and in
//    synchronize(), the bucket is scaled in place and handed back whole.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "accumulator_hooks.h"
#include "bucket_set.h"
#include "engine/engine.h"
#include "grad_reducer_options.h"
#include "gradients/pass_counter.h"

namespace hvdtorch {

class GradientReducer {
 public:
  // `counter`: the pass counter to share with the caller (its own rules:
  // strict, k, the error's advice); null: the reducer's own, cyclic over
  // options.backward_passes_per_step. InvalidArgument for bad options or a
  // bad layout, and for a parameter that does not require grad.
  GradientReducer(std::shared_ptr<Engine> engine, std::vector<at::Tensor> params,
                  std::vector<std::vector<int64_t>> buckets, GradReducerOptions options,
                  std::shared_ptr<PassCounter> counter = nullptr);

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
  std::vector<std::vector<int64_t>> bucketParams() const { return set_.bucketParams(); }
  // Every bucket's result in the parameters' dtype (the strategy's: the whole
  // bucket, or this rank's shard), then the step: the counter's reset().
  // After a reduced pass it waits for what backward launched; otherwise
  // (fewer passes, or none) it reduces what .grad holds now, zeros for a
  // parameter without one. Raises the first error.
  std::vector<at::Tensor> synchronize();
  // The counted passes: whether one ran since the last step,
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
  // Compiled autograd (see the contract above): removes the C++ hooks and
  // stops using .grad, for good. InvalidArgument during a pass, for an index
  // out of range, and for a list of grads of the wrong length.
  void useTracedHooks();
  bool tracedHooks() const { return traced_hooks_; }
  void gradientReady(int64_t index, const at::Tensor& grad);
  // Whether the next backward pass reduces (outside no_sync(), the k-th
  // pass, more than an identity): then it gives every parameter a .grad,
  // one unused this pass included (its slot's result).
  bool nextPassReduces();
  void backwardEnded(const std::vector<std::optional<at::Tensor>>& grads);
  // Called once per backward pass on the autograd thread, outside the
  // reducer's lock: `at_start` when the pass begins, before anything of it
  // accumulates into .grad; `after_drop` at the end of a reduced pass whose
  // strategy dropped .grad (the shard strategies). shard=2's stand-in
  // gradients hang on them (hvdtorch/zero/held_gradients.py). Set before
  // the first backward pass.
  void setPassCallbacks(std::function<void()> at_start, std::function<void()> after_drop);
  // Parameter indices no rank gave a gradient in the last reduced pass's
  // window (options.unused set; empty otherwise), in index order.
  std::vector<int64_t> unusedEverywhere();
  const std::shared_ptr<PassCounter>& counter() const { return counter_; }
  // The buckets' flat tensors and bytes (for tests and logs), in bucket order.
  std::vector<at::Tensor> flats() const { return set_.flats(); }
  std::vector<int64_t> bucketBytes() const { return set_.bucketBytes(); }

 private:
  using Bucket = BucketSet::Bucket;

  void beforeGrad(size_t index, const torch::autograd::variable_list& grads);
  // `given`: the gradient, from the traced hooks (useTracedHooks); null: .grad.
  void onGradReady(size_t index, const at::Tensor* given = nullptr);
  void startPass();
  // synchronize() with no reduced pass in flight: every slot is written afresh.
  void startReductionNow();
  // Puts `grad` (zeros when undefined) into the slot; returns the slot.
  at::Tensor fillSlot(Bucket& b, size_t slot, const at::Tensor& grad);
  // Puts the parameter's .grad (zeros when undefined) into its slot and, with
  // views, makes .grad that slot.
  void writeSlot(Bucket& b, size_t slot);
  // Launches every bucket not launched yet, filling the slots of gradients
  // not seen this pass: from `given` (the traced hooks' gradients), or .grad.
  void launchRemaining(const std::vector<std::optional<at::Tensor>>* given = nullptr);
  // The BucketSet's waitAll(), which ends the pass whatever it raises.
  std::vector<at::Tensor> waitAll();
  void endOfBackward();
  // options.unused: this window's flags, made once per reduced pass before
  // its remaining buckets launch ("report": their sum starts then); the
  // outcome once the results of `buckets` are in ("leave": their candidates'
  // flags summed in an op named <name><suffix>, when there are any).
  void startUnusedFlags(const std::vector<std::optional<at::Tensor>>* given);
  void settleUnused(const std::vector<size_t>& buckets, const std::vector<at::Tensor>& results,
                    const std::string& suffix);
  // "report", or a strategy whose results cannot tell (zerosReduceToZeros()
  // false): every flag is summed, started at the end of backward.
  bool flagsSummedAtLaunch() const;
  // The sum of `flags` over the set, in place, as the op <name><suffix>.
  std::shared_ptr<OpState> startFlagSum(const at::Tensor& flags, const std::string& suffix);
  // Otherwise: the candidates among `buckets` (a first reduced element of
  // zero) have their `flags` (this rank's) summed.
  void findUnused(const std::vector<size_t>& buckets, const std::vector<at::Tensor>& results, const float* flags,
                  const std::string& suffix);

  BucketSet set_;
  std::vector<bool> ready_;
  std::vector<uint8_t> used_;           // a pass gave the parameter a gradient since the last reduction
  std::shared_ptr<OpState> unused_op_;  // the flags' sum in flight
  at::Tensor unused_flags_;
  bool unused_started_ = false;       // this reduced pass's flags were made
  std::vector<bool> unused_checked_;  // per bucket: its results were looked at this pass
  bool unused_summed_ = false;        // "report": this pass's sums were read
  std::vector<int64_t> unused_everywhere_;
  std::vector<int64_t> ready_order_;
  bool recorded_order_ = false;

  std::mutex mu_;
  bool pass_active_ = false;
  bool pass_ended_ = false;  // backward finished, results not yet waited for
  bool reduce_this_pass_ = false;
  bool traced_hooks_ = false;  // useTracedHooks(): the caller queues the end of the pass
  // A reduced pass is in flight (its buckets may still be launched or waited for); mu_ held.
  bool reducingLocked() const { return pass_active_ && reduce_this_pass_; }
  std::function<void()> at_pass_start_;     // setPassCallbacks
  std::function<void()> after_grads_drop_;  // setPassCallbacks
  std::shared_ptr<PassCounter> counter_;    // setSyncEnabled(false) makes passes local (uncounted)
  // Declared last: removed first, so no hook runs into a reducer being destroyed.
  AccumulatorHooks hooks_;
};

}  // namespace hvdtorch
