#include "grad_reducer.h"

#include <torch/csrc/autograd/engine.h>

#include <algorithm>

#include "common/error.h"
#include "python_errors.h"
#include "strategies/engine_ops.h"

namespace hvdtorch {

using torch::autograd::variable_list;

namespace {

// The reducer's own counter: cyclic.
std::shared_ptr<PassCounter> ownCounter(int passes_per_step, int rank) {
  PassCounterOptions o;
  o.passes_per_step = passes_per_step;  // checked by the counter (>= 1)
  o.strict = false;
  o.rank = rank;
  return std::make_shared<PassCounter>(o);
}

}  // namespace

GradientReducer::GradientReducer(std::shared_ptr<Engine> engine, std::vector<at::Tensor> params,
                                 std::vector<std::vector<int64_t>> buckets, GradReducerOptions options,
                                 std::shared_ptr<PassCounter> counter)
    : set_(std::move(engine), std::move(params), buckets, std::move(options), /*grads=*/true),
      counter_(counter ? std::move(counter)
                       : ownCounter(set_.options().backward_passes_per_step, set_.engine()->topo().rank)) {
  const auto& hooked = set_.params();
  ready_.assign(hooked.size(), false);
  used_.assign(hooked.size(), 0);
  for (size_t i = 0; i < hooked.size(); ++i)
    hooks_.add(
        hooked[i], set_.options().name, i, [this, i](const variable_list& grads) { beforeGrad(i, grads); },
        [this, i] { onGradReady(i); });
}

void GradientReducer::rebuild(const std::vector<std::vector<int64_t>>& layout) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pass_active_) throw InvalidArgument(strCat(set_.options().name, ": cannot rebuild buckets during backward"));
  set_.rebuild(layout);
}

std::vector<int64_t> GradientReducer::readyOrder() {
  std::lock_guard<std::mutex> lock(mu_);
  return recorded_order_ ? ready_order_ : std::vector<int64_t>{};
}

void GradientReducer::setSyncEnabled(bool enabled) {
  std::lock_guard<std::mutex> lock(mu_);
  counter_->setLocal(!enabled);
}

bool GradientReducer::passesPending() {
  std::lock_guard<std::mutex> lock(mu_);
  return counter_->pending();
}

void GradientReducer::resetPasses(std::optional<int> passes_per_step) {
  std::lock_guard<std::mutex> lock(mu_);
  counter_->reset(passes_per_step);
  std::fill(used_.begin(), used_.end(), 0);  // the passes' gradients are dropped with them
}

void GradientReducer::setPassesPerStep(int passes_per_step) {
  std::lock_guard<std::mutex> lock(mu_);
  counter_->setPassesPerStep(passes_per_step);
}

void GradientReducer::beforeGrad(size_t index, const variable_list& grads) {
  bool started = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pass_active_ || pass_ended_) {
      startPass();
      started = true;
    }
    used_[index] = 1;
    const std::string& refusal = set_.options().sparse_refusal;
    if (!refusal.empty() && !grads.empty() && grads[0].defined() && grads[0].layout() != c10::kStrided)
      throw InvalidArgument(strCat("hvdtorch: rank ", set_.engine()->topo().rank, ": parameter '",
                                   set_.paramName(index), "' got a sparse gradient; ", refusal));
  }
  if (started && at_pass_start_) at_pass_start_();  // outside the lock: it may be Python
}

void GradientReducer::useTracedHooks() {
  std::lock_guard<std::mutex> lock(mu_);
  if (pass_active_ && !pass_ended_)
    throw InvalidArgument(strCat(set_.options().name, ": cannot change hooks during backward"));
  hooks_.clear();
  set_.leaveGradients();
  traced_hooks_ = true;
}

void GradientReducer::gradientReady(int64_t index, const at::Tensor& grad) {
  if (index < 0 || static_cast<size_t>(index) >= ready_.size())
    throw InvalidArgument(
        strCat(set_.options().name, ": gradientReady(", index, "): there are ", ready_.size(), " parameters"));
  const auto i = static_cast<size_t>(index);
  beforeGrad(i, {grad});
  onGradReady(i, &grad);
}

bool GradientReducer::nextPassReduces() {
  std::lock_guard<std::mutex> lock(mu_);
  if (set_.loneIdentity() || counter_->local()) return false;
  return counter_->passes() + 1 == counter_->passesPerStep();
}

void GradientReducer::backwardEnded(const std::vector<std::optional<at::Tensor>>& grads) {
  std::lock_guard<std::mutex> lock(mu_);
  if (grads.size() != ready_.size())
    throw InvalidArgument(strCat(set_.options().name, ": backwardEnded() got ", grads.size(), " gradients for ",
                                 ready_.size(), " parameters"));
  if (!pass_active_ || pass_ended_) return;
  counter_->endPass();
  if (!reduce_this_pass_ || set_.loneIdentity()) {
    pass_active_ = false;
    return;
  }
  launchRemaining(&grads);
  recorded_order_ = true;
  pass_ended_ = true;
  const std::vector<at::Tensor> results = waitAll();
  for (size_t j = 0; j < set_.buckets().size(); ++j) {
    const Bucket& b = set_.buckets()[j];
    if (!results[j].defined()) continue;
    for (size_t s = 0; s < b.params.size(); ++s) {
      const size_t p = b.params[s];
      if (!grads[p] || !grads[p]->defined()) continue;
      at::Tensor out = *grads[p];
      out.copy_(results[j].narrow(0, b.offsets[s], out.numel()).view(out.sizes()));
    }
  }
}

void GradientReducer::setPassCallbacks(std::function<void()> at_start, std::function<void()> after_drop) {
  std::lock_guard<std::mutex> lock(mu_);
  at_pass_start_ = std::move(at_start);
  after_grads_drop_ = std::move(after_drop);
}

void GradientReducer::startPass() {
  // Counted first: a pass over the limit raises before anything is touched.
  // The caller sharing the counter may have begun the pass already.
  if (!counter_->inPass()) {
    counter_->setRank(set_.engine()->topo().rank);  // named by the error; an elastic job may renumber ranks
    counter_->beginPass();
  }
  // In explicit mode the caller may skip finalize(); the previous pass's
  // results are then waited for here, before its buckets are reused.
  if (pass_active_ && pass_ended_) waitAll();
  pass_active_ = true;
  pass_ended_ = false;
  reduce_this_pass_ = counter_->reducing();
  unused_started_ = false;
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& b : set_.buckets()) {
    b.pending = static_cast<int>(b.params.size());
    b.launched = false;
  }
  if (!recorded_order_) ready_order_.clear();
  if (traced_hooks_) return;  // the caller's traced hooks end the pass (backwardEnded)
  // Runs once the whole backward pass is done, on the autograd engine's thread.
  torch::autograd::Engine::get_default_engine().queue_callback([this] {
    try {
      endOfBackward();
    } catch (...) {
      rethrowForAutograd(std::current_exception());
    }
  });
}

at::Tensor GradientReducer::fillSlot(Bucket& b, size_t slot, const at::Tensor& grad) {
  set_.hold(b);
  const at::Tensor view = set_.slotView(b, slot);
  if (!grad.defined()) {
    view.zero_();
  } else if (grad.data_ptr() != view.data_ptr()) {
    view.copy_(grad);  // converts when the bucket has a wire dtype
  }
  return view;
}

void GradientReducer::writeSlot(Bucket& b, size_t slot) {
  at::Tensor& grad = set_.params()[b.params[slot]].mutable_grad();
  const at::Tensor view = fillSlot(b, slot, grad);
  if (b.views) grad = view;
}

void GradientReducer::startReductionNow() {
  pass_active_ = true;
  pass_ended_ = true;
  reduce_this_pass_ = true;
  unused_started_ = false;
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& b : set_.buckets()) b.launched = false;
}

void GradientReducer::onGradReady(size_t index, const at::Tensor* given) {
  // One rank: averaging is the identity (prescale x postscale = 1, Sum of
  // one), so gradients stay where autograd put them and nothing runs.
  if (set_.loneIdentity()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!pass_active_ || pass_ended_) return;  // the pre-hook did not run (the pass was refused)
  Bucket& b = set_.bucketOf(index);
  const size_t slot = set_.slotOf(index);
  if (!reduce_this_pass_) {
    // Accumulating locally: keep .grad a view so later passes add in place
    // (traced hooks have no views: compiled autograd adds into .grad itself).
    if (b.views) writeSlot(b, slot);
    return;
  }
  if (ready_[index]) return;  // a hook may fire twice for a reused accumulator
  ready_[index] = true;
  if (!recorded_order_) ready_order_.push_back(static_cast<int64_t>(index));
  if (given != nullptr) {
    fillSlot(b, slot, *given);
  } else {
    writeSlot(b, slot);
  }
  if (--b.pending == 0 && set_.options().pipeline) {
    set_.collectFinished();  // buckets released as early as their reductions allow
    set_.launch(set_.bucketIndexOf(index));
  }
}

void GradientReducer::launchRemaining(const std::vector<std::optional<at::Tensor>>* given) {
  // Index order, on every rank: parameters without a gradient this pass
  // (unused branches) contribute no new gradient: their .grad so far, or
  // zeros (a slot may still hold last pass's result after .grad was cleared).
  if (!unused_started_ && !set_.options().unused.empty()) startUnusedFlags(given);
  for (size_t i = 0; i < set_.buckets().size(); ++i) {
    Bucket& b = set_.buckets()[i];
    if (b.launched) continue;
    for (size_t s = 0; s < b.params.size(); ++s) {
      const size_t p = b.params[s];
      if (ready_[p]) continue;
      ready_[p] = true;
      if (given != nullptr) {
        fillSlot(b, s, (*given)[p].value_or(at::Tensor()));
      } else {
        writeSlot(b, s);
      }
    }
    set_.launch(i);
  }
}

std::vector<at::Tensor> GradientReducer::waitAll() {
  struct EndPass {
    bool& active;
    ~EndPass() { active = false; }
  } end{pass_active_};
  std::vector<at::Tensor> results;
  try {
    results = set_.waitAll();
  } catch (...) {
    unused_op_.reset();  // the op keeps its tensor alive; the job is failing anyway
    throw;
  }
  std::vector<size_t> all(results.size());
  for (size_t j = 0; j < all.size(); ++j) all[j] = j;
  settleUnused(all, results, ".unused");
  return results;
}

void GradientReducer::startUnusedFlags(const std::vector<std::optional<at::Tensor>>* given) {
  unused_started_ = true;
  unused_everywhere_.clear();
  unused_checked_.assign(set_.buckets().size(), false);
  unused_summed_ = false;
  const bool leave = set_.options().unused == "leave";
  const size_t n = used_.size();
  unused_flags_ = at::zeros({static_cast<int64_t>(n)}, at::kFloat);
  float* flag = unused_flags_.data_ptr<float>();
  for (size_t p = 0; p < n; ++p) {
    // The traced hooks' end of a pass gives every parameter a gradient (zeros
    // where it had none): there, only use counts.
    const bool gave = used_[p] != 0 || (leave && given == nullptr && set_.params()[p].grad().defined());
    flag[p] = gave ? 1.0F : 0.0F;
  }
  std::fill(used_.begin(), used_.end(), 0);  // the next window starts
  // Otherwise ("leave" over a strategy that reduces zeros to zeros) flags are
  // summed only where the results call for it (findUnused).
  if (set_.setSize() >= 2 && flagsSummedAtLaunch()) unused_op_ = startFlagSum(unused_flags_, ".unused");
}

bool GradientReducer::flagsSummedAtLaunch() const {
  return set_.options().unused == "report" || !set_.strategy().zerosReduceToZeros();
}

std::shared_ptr<OpState> GradientReducer::startFlagSum(const at::Tensor& flags, const std::string& suffix) {
  ops::AllreduceOptions o;
  o.op = ReduceOp::kSum;  // a count of the ranks that gave one: exact in float up to 2^24 ranks
  o.process_set_id = set_.options().process_set_id;
  return allreduceInPlace(*set_.engine(), std::move(o), flags, set_.options().name + suffix);
}

void GradientReducer::settleUnused(const std::vector<size_t>& buckets, const std::vector<at::Tensor>& results,
                                   const std::string& suffix) {
  if (!unused_started_) return;
  const float* flags = unused_flags_.data_ptr<float>();  // this rank's; their sums once summed at launch
  if (flagsSummedAtLaunch()) {
    if (unused_op_) {
      std::shared_ptr<OpState> op = std::move(unused_op_);
      waitForOp(*op);
    }
    if (!unused_summed_) {
      unused_summed_ = true;
      for (int64_t p = 0; p < unused_flags_.numel(); ++p)
        if (flags[p] == 0.0F) unused_everywhere_.push_back(p);
    }
  } else {
    findUnused(buckets, results, flags, suffix);
  }
  if (set_.options().unused != "leave") return;
  if (traced_hooks_ && !unused_everywhere_.empty()) {
    // Compiled autograd's graph writes every .grad when it ends: None cannot be left.
    std::string names;
    for (size_t i = 0; i < unused_everywhere_.size() && i < 5; ++i)
      names += strCat(i ? ", '" : "'", set_.paramName(static_cast<size_t>(unused_everywhere_[i])), "'");
    throw InvalidArgument(strCat(
        "hvdtorch: rank ", set_.engine()->topo().rank, ": ", unused_everywhere_.size(),
        " parameter(s) got no gradient on any rank in this step (", names,
        "); under compiled autograd the graph gives each a zero .grad, which the optimizer would step on (weight "
        "decay, momentum) where one process and DDP leave .grad None and skip it. Freeze what no loss uses "
        "(p.requires_grad_(False)), or run this model's backward with compiled autograd off"));
  }
  // Again after each bucket: a later bucket's decode may have written .grad anew.
  for (int64_t p : unused_everywhere_) set_.params()[static_cast<size_t>(p)].mutable_grad() = at::Tensor();
}

void GradientReducer::findUnused(const std::vector<size_t>& buckets, const std::vector<at::Tensor>& results,
                                 const float* flags, const std::string& suffix) {
  // A parameter no rank gave a gradient has an all-zero result, the same on
  // every rank (every reduction hands each rank the same values, and the
  // strategy reduces zeros to zeros). Only those whose first reduced element
  // is zero are candidates, so the ranks agree without a message whether any
  // flags must be summed, and a pass where every parameter was used sends
  // nothing more.
  std::vector<int64_t> candidates;
  for (size_t j : buckets) {
    if (unused_checked_[j] || j >= results.size() || !results[j].defined()) continue;
    unused_checked_[j] = true;
    const Bucket& b = set_.buckets()[j];
    std::vector<int64_t> firsts, params;
    for (size_t s = 0; s < b.params.size(); ++s) {
      if (set_.params()[b.params[s]].numel() == 0) continue;
      firsts.push_back(b.offsets[s]);
      params.push_back(b.params[s]);
    }
    if (firsts.empty()) continue;
    const at::Tensor index = at::tensor(firsts, at::kLong).to(results[j].device());
    const at::Tensor zero = results[j].index_select(0, index).eq(0).to(at::kCPU);
    const bool* is_zero = zero.data_ptr<bool>();
    for (size_t k = 0; k < params.size(); ++k)
      if (is_zero[k]) candidates.push_back(params[k]);
  }
  if (candidates.empty()) return;
  at::Tensor sums = at::empty({static_cast<int64_t>(candidates.size())}, at::kFloat);
  float* sum = sums.data_ptr<float>();
  for (size_t k = 0; k < candidates.size(); ++k) sum[k] = flags[candidates[k]];
  if (set_.setSize() >= 2) waitForOp(*startFlagSum(sums, suffix));
  for (size_t k = 0; k < candidates.size(); ++k)
    if (sum[k] == 0.0F) unused_everywhere_.push_back(candidates[k]);
  std::sort(unused_everywhere_.begin(), unused_everywhere_.end());
}

std::vector<int64_t> GradientReducer::unusedEverywhere() {
  std::lock_guard<std::mutex> lock(mu_);
  return unused_everywhere_;
}

void GradientReducer::endOfBackward() {
  bool dropped = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pass_active_ || pass_ended_) return;
    counter_->endPass();
    if (!reduce_this_pass_ || set_.loneIdentity()) {
      pass_active_ = false;
      return;
    }
    launchRemaining();
    recorded_order_ = true;
    pass_ended_ = true;
    dropped = !set_.strategy().keepsGradients();
    if (set_.options().sync_on_backward) waitAll();
  }
  if (dropped && after_grads_drop_) after_grads_drop_();  // outside the lock: it may be Python
}

void GradientReducer::finalize() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!reducingLocked()) return;
  launchRemaining();
  waitAll();
}

bool GradientReducer::reducing() {
  std::lock_guard<std::mutex> lock(mu_);
  return reducingLocked();
}

void GradientReducer::finishBucket(int64_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string& name = set_.options().name;
  const size_t count = set_.buckets().size();
  if (index < 0 || index >= static_cast<int64_t>(count))
    throw InvalidArgument(strCat(name, ": finishBucket(", index, "): there are ", count, " buckets"));
  if (!set_.strategy().keepsGradients())
    throw InvalidArgument(strCat(name, ": finishBucket() needs a strategy that hands gradients back"));
  if (!reducingLocked()) return;
  launchRemaining();
  Bucket& b = set_.buckets()[static_cast<size_t>(index)];
  if (!b.op) return;
  try {
    std::vector<at::Tensor> results(set_.buckets().size());
    results[static_cast<size_t>(index)] = set_.decode(b, b.op->finish());
    settleUnused({static_cast<size_t>(index)}, results, strCat(".unused.b", index));
  } catch (...) {
    b.op.reset();
    try {
      waitAll();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the first error is the one raised
    }
    pass_active_ = false;
    throw;
  }
  b.op.reset();
}

std::vector<at::Tensor> GradientReducer::synchronize() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!reducingLocked()) startReductionNow();
  launchRemaining();
  std::vector<at::Tensor> results = waitAll();
  counter_->reset();
  return results;
}

void GradientReducer::viewGradients() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Bucket& b : set_.buckets()) {
    if (!b.views || b.op) continue;
    b.flat.zero_();
    for (size_t s = 0; s < b.params.size(); ++s) set_.params()[b.params[s]].mutable_grad() = set_.slotView(b, s);
  }
}

}  // namespace hvdtorch
