// The reducer of the Adasum optimizer (training/adasum_optimizer.py): it
// reduces what its owner hands it, not what backward produces.
//
// Contract:
//  * Backward passes reduce nothing and never touch .grad or the buckets. A
//    pre-hook on each parameter's gradient accumulator only counts: each
//    parameter on a pass counter of its own (a copy of the given counter's
//    rules, gradients/pass_counter.h), so a parameter unused in a pass does
//    not count it, and its (k+1)-th gradient raises PassLimitError before
//    .grad is touched. A sparse gradient is refused when the options say so.
//  * reduceNow(tensors) is the reduction and the step: each tensor goes into
//    its parameter's slot of the BucketSet (bucket_set.h; in the codec's wire
//    dtype), every bucket is launched in index order and waited for, each
//    tensor gets its reduced slot back (decoded), and the counters are reset.
//  * Its strategy is the options' (the Adasum optimizer's: `adasum`).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "accumulator_hooks.h"
#include "bucket_set.h"
#include "grad_reducer_options.h"
#include "gradients/pass_counter.h"

namespace hvdtorch {

class DeltaReducer {
 public:
  // `counter`: the rules each parameter's counter copies (null: strict, the
  // default advice). InvalidArgument for bad options or a bad layout, and
  // for a parameter that does not require grad.
  DeltaReducer(std::shared_ptr<Engine> engine, std::vector<at::Tensor> params,
               const std::vector<std::vector<int64_t>>& buckets, GradReducerOptions options,
               const std::shared_ptr<PassCounter>& counter = nullptr);

  // Reduces `tensors` (one per parameter, in the reducer's order, each of its
  // parameter's numel) in place (contract above), then resets the pass
  // counters. InvalidArgument for tensors that do not fit. Raises the first error.
  void reduceNow(const std::vector<at::Tensor>& tensors);
  // The counted passes: whether one ran since the last step, forget them (a
  // given k also sets backward_passes_per_step), change k keeping them.
  bool passesPending();
  void resetPasses(std::optional<int> passes_per_step = std::nullopt);
  void setPassesPerStep(int passes_per_step);

  std::vector<at::Tensor> flats() const { return set_.flats(); }
  std::vector<int64_t> bucketBytes() const { return set_.bucketBytes(); }

 private:
  // Parameter `index` got its gradient of a pass.
  void beforeGrad(size_t index, const torch::autograd::variable_list& grads);

  BucketSet set_;
  std::mutex mu_;
  std::vector<PassCounter> counters_;  // one per parameter, the given counter's rules
  // Declared last: removed first, so no hook runs into a reducer being destroyed.
  AccumulatorHooks hooks_;
};

}  // namespace hvdtorch
