#include "gradients/pass_counter.h"

#include "common/error.h"

namespace hvdtorch {

namespace {

void checkPassesPerStep(int k) {
  if (k < 1) throw InvalidArgument(strCat("hvdtorch: backward_passes_per_step must be >= 1, got ", k));
}

}  // namespace

PassCounter::PassCounter(PassCounterOptions options) : options_(std::move(options)) {
  checkPassesPerStep(options_.passes_per_step);
}

bool PassCounter::beginPass(const std::string& subject) {
  const int k = options_.passes_per_step;
  if (local_) {
    in_pass_ = true;
    reducing_ = false;
    return false;
  }
  if (options_.strict && passes_ >= k) {
    const std::string who = subject.empty() ? "" : strCat("parameter '", subject, "' got a gradient in ");
    throw PassLimitError(strCat("hvdtorch: rank ", options_.rank, ": ", who, "backward pass ", passes_ + 1,
                                " since the last step(), but backward_passes_per_step=", k, ": call ",
                                options_.step_call, " after every ", k, " backward pass", k > 1 ? "es" : "", ", or ",
                                options_.advice));
  }
  in_pass_ = true;
  ++passes_;
  reducing_ = passes_ == k;
  if (!options_.strict && reducing_) passes_ = 0;
  return reducing_;
}

void PassCounter::setPassesPerStep(int passes_per_step) {
  checkPassesPerStep(passes_per_step);
  options_.passes_per_step = passes_per_step;
}

void PassCounter::reset(std::optional<int> passes_per_step) {
  if (passes_per_step) setPassesPerStep(*passes_per_step);
  passes_ = 0;
}

}  // namespace hvdtorch
