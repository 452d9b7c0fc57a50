// Backward passes between two optimizer steps: the one counter of every
// gradient path (DistributedModel's GradientReducer, DistributedOptimizer's
// GradientSync and the sharded optimizer's BucketGradients, each of which
// gives its strict counter to its GradientReducer; the Adasum optimizer's
// GradientReducer, which counts each parameter on a copy of the counter it
// is given), so that backward_passes_per_step and no_sync() mean the same
// thing everywhere.
//
// Contract:
//  * beginPass() is called once at the start of a backward pass (by the first
//    gradient hook that fires in it) and endPass() once at its end (by a
//    callback queued on the autograd engine). beginPass() decides whether the
//    pass reduces: the k-th counted pass does (k = backward_passes_per_step),
//    the others accumulate locally.
//  * A pass inside no_sync() (setLocal(true)) is not counted and never reduces.
//  * Strict (the optimizers, Horovod's contract): counted passes add up until
//    reset() (the step); the (k+1)-th raises PassLimitError from beginPass(),
//    before anything is counted or touched, naming the rank, the pass, k and
//    what to do instead. Cyclic (DistributedModel): after the k-th pass the
//    count starts again, nothing raises.
//  * pending(): a counted pass ran since the last reset(). due(): the counted
//    passes are exactly k (the last one reduced, so everything was launched).
//  * Not thread-safe: the owner calls it under its own lock or on the thread
//    that runs the hooks.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

namespace hvdtorch {

// A backward pass more than backward_passes_per_step before the step: a
// misuse of the training loop (Python: AssertionError, as Horovod raises).
class PassLimitError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

struct PassCounterOptions {
  int passes_per_step = 1;  // k, >= 1 (InvalidArgument otherwise)
  bool strict = true;       // raise on the (k+1)-th counted pass; false: count cyclically
  int rank = 0;             // named by the error
  // The error's advice: "call <step_call> after every k backward passes, or <advice>".
  std::string step_call = "optimizer.step() (or synchronize())";
  std::string advice = "raise backward_passes_per_step to accumulate more passes locally";
};

class PassCounter {
 public:
  explicit PassCounter(PassCounterOptions options);

  // Starts a backward pass; returns whether it reduces. `subject` (a
  // parameter's name, or empty) is named by the error when there is one.
  bool beginPass(const std::string& subject = "");
  void endPass() { in_pass_ = false; }
  bool inPass() const { return in_pass_; }
  // Whether the pass running now (or the last one) reduces.
  bool reducing() const { return reducing_; }

  void setLocal(bool local) { local_ = local; }
  bool local() const { return local_; }

  int passes() const { return passes_; }
  bool pending() const { return passes_ > 0; }
  bool due() const { return passes_ == options_.passes_per_step; }
  int passesPerStep() const { return options_.passes_per_step; }
  // The rank the error names (it may change: an elastic job re-initialises).
  void setRank(int rank) { options_.rank = rank; }
  // Changes k and keeps the count (the Adasum optimizer's set_backward_passes_per_step()).
  void setPassesPerStep(int passes_per_step);
  // The step: forgets the passes counted so far; a given passes_per_step also sets k.
  void reset(std::optional<int> passes_per_step = std::nullopt);

 private:
  PassCounterOptions options_;
  int passes_ = 0;  // counted passes since the last reset (strict) or reduced pass (cyclic)
  bool in_pass_ = false;
  bool reducing_ = false;
  bool local_ = false;
};

}  // namespace hvdtorch
