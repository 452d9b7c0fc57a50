#include "grad_reducer.h"

#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <algorithm>

#include "common/error.h"
#include "gradients/bucket_packing.h"
#include "python_errors.h"
#include "registered_tensor.h"
#include "strategies/registry.h"
#include "tensor_binding.h"
#include "torch_tensor.h"

namespace hvdtorch {

using torch::autograd::variable_list;

namespace {

// The reducer's own counter: cyclic, or strict in deltas mode (each parameter's counter copies its rules).
std::shared_ptr<PassCounter> ownCounter(int passes_per_step, bool strict, int rank) {
  PassCounterOptions o;
  o.passes_per_step = passes_per_step;  // checked by the counter (>= 1)
  o.strict = strict;
  o.rank = rank;
  return std::make_shared<PassCounter>(o);
}

// Runs `fn(grads)` before the accumulator adds the gradient; errors go through rethrowForAutograd.
class PreHook : public torch::autograd::FunctionPreHook {
 public:
  explicit PreHook(std::function<void(const variable_list&)> fn) : fn_(std::move(fn)) {}
  variable_list operator()(const variable_list& grads) override {
    try {
      fn_(grads);
    } catch (...) {
      rethrowForAutograd(std::current_exception());
    }
    return grads;
  }

 private:
  std::function<void(const variable_list&)> fn_;
};

// Alone in the process set: nothing to reduce with, the scale factors still apply.
class LoneBucket : public BucketOp {
 public:
  LoneBucket(at::Tensor flat, double scale) : flat_(std::move(flat)), scale_(scale) {}
  at::Tensor finish() override { return scale_ != 1.0 ? flat_.mul_(scale_) : flat_; }
  void drain(std::chrono::milliseconds /*timeout*/) override {}

 private:
  at::Tensor flat_;
  double scale_;
};

}  // namespace

GradientReducer::GradientReducer(std::shared_ptr<Engine> engine, std::vector<at::Tensor> params,
                                 std::vector<std::vector<int64_t>> buckets, GradReducerOptions options,
                                 std::shared_ptr<PassCounter> counter)
    : engine_(std::move(engine)),
      params_(std::move(params)),
      opts_(std::move(options)),
      strategy_(opts_.strategy_instance ? opts_.strategy_instance
                                        : std::shared_ptr<BucketStrategy>(makeBucketStrategy(opts_.strategy))),
      counter_(counter ? std::move(counter)
                       : ownCounter(opts_.backward_passes_per_step, opts_.mode == ReducerMode::kDeltas,
                                    engine_->topo().rank)) {
  if (opts_.op != ReduceOp::kAverage && opts_.op != ReduceOp::kSum && opts_.op != ReduceOp::kAdasum)
    throw InvalidArgument(
        strCat(opts_.name, ": gradients are reduced with Average, Sum or Adasum, not ", reduceOpName(opts_.op)));
  ops::AllreduceOptions& allreduce = ctx_.allreduce;
  allreduce.op = opts_.op;
  allreduce.prescale = opts_.prescale;
  allreduce.postscale = opts_.postscale;
  allreduce.reducer = opts_.reducer;  // the user's, passed through; the engine picks for "" and auto
  allreduce.fuse = opts_.fuse;
  allreduce.process_set_id = opts_.process_set_id;
  const auto set = engine_->processSet(opts_.process_set_id);
  if (!set || !set->member())
    throw InvalidArgument(strCat(opts_.name, ": process set ", opts_.process_set_id,
                                 set ? " does not include this rank" : " does not exist"));
  set_size_ = static_cast<int>(set->ranks.size());
  ctx_.engine = engine_.get();
  ctx_.set_size = set_size_;
  ctx_.set_rank = set->set_rank;
  // A strategy that drops gradients needs the hooks even alone: .grad is dropped when a bucket launches.
  lone_identity_ = set_size_ == 1 && opts_.prescale * opts_.postscale == 1.0 && strategy_->keepsGradients();
  ready_.assign(params_.size(), false);
  if (opts_.mode == ReducerMode::kDeltas) {
    PassCounter rules = *counter_;
    rules.reset();
    param_counters_.assign(params_.size(), rules);
  }
  rebuild(buckets);
  // Bad options (an unknown or unavailable reducer, say) fail here, not in
  // the first backward pass.
  ops::AllreduceOptions probe = ctx_.allreduce;
  probe.name = opts_.name;
  for (const auto& b : buckets_)
    probe.inputs.push_back(std::make_shared<TorchTensor>(b.flat, toDataType(b.flat.scalar_type(), opts_.name)));
  probe.outputs = probe.inputs;  // in place, as the buckets are reduced
  ops::allreduceArgs(*engine_, probe);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].requires_grad())
      throw InvalidArgument(strCat(opts_.name, ": parameter ", i, " does not require grad"));
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    auto pre = std::make_unique<PreHook>([this, i](const variable_list& grads) { beforeGrad(i, grads); });
    pre_hooks_.push_back(pre.get());
    acc->add_pre_hook(std::move(pre));
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const variable_list& outputs, const variable_list& /*inputs*/) {
          try {
            onGradReady(i);
          } catch (...) {
            rethrowForAutograd(std::current_exception());
          }
          return outputs;
        })));
    accumulators_.push_back(std::move(acc));
  }
}

GradientReducer::~GradientReducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    accumulators_[i]->del_post_hook(hook_keys_[i]);
    auto& pre = accumulators_[i]->pre_hooks();
    const auto* mine = pre_hooks_[i];
    pre.erase(std::remove_if(pre.begin(), pre.end(), [mine](const auto& h) { return h.get() == mine; }), pre.end());
  }
  // Never leave the engine writing into buckets we are about to free.
  const auto timeout =
      std::chrono::duration_cast<std::chrono::milliseconds>(engine_->config().timeout + std::chrono::seconds(5));
  for (auto& b : buckets_)
    if (b.op) b.op->drain(timeout);
}

void GradientReducer::rebuild(const std::vector<std::vector<int64_t>>& layout) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pass_active_) throw InvalidArgument(strCat(opts_.name, ": cannot rebuild buckets during backward"));
  std::vector<bool> seen(params_.size(), false);
  std::vector<Bucket> next;
  std::vector<size_t> bucket_of(params_.size()), slot_of(params_.size());
  for (const auto& members : layout) {
    if (members.empty()) continue;
    Bucket b;
    const at::ScalarType dtype = params_[members[0]].scalar_type();
    const at::ScalarType bucket_dtype = wireScalarType(opts_.codec, dtype);
    b.views = bucket_dtype == dtype && opts_.mode == ReducerMode::kGradients;  // deltas leave .grad alone
    std::vector<int64_t> numels;
    for (int64_t idx : members) {
      if (idx < 0 || idx >= static_cast<int64_t>(params_.size()) || seen[idx])
        throw InvalidArgument(strCat(opts_.name, ": bad bucket layout (parameter ", idx, ")"));
      if (params_[idx].scalar_type() != dtype) throw InvalidArgument(strCat(opts_.name, ": a bucket mixes dtypes"));
      if (params_[idx].device() != params_[members[0]].device())
        throw InvalidArgument(strCat(opts_.name, ": parameter ", idx, " is on ", params_[idx].device().str(),
                                     ", parameter ", members[0], " of the same bucket on ",
                                     params_[members[0]].device().str(), "; a bucket holds one device"));
      seen[idx] = true;
      bucket_of[idx] = next.size();
      slot_of[idx] = b.params.size();
      b.params.push_back(idx);
      numels.push_back(params_[idx].numel());
    }
    BucketPacking packing = packBucket(numels);
    b.offsets = std::move(packing.offsets);
    const int64_t total = packing.numel;
    // CPU buckets live in registered memory where the strategy reduces them
    // in place: the node reducer then needs no copy through the node arena.
    const at::TensorOptions options = params_[members[0]].options().dtype(bucket_dtype).requires_grad(false);
    b.flat = options.device().is_cpu() && strategy_->registeredBuckets()
                 ? registeredZeros(*engine_, total, bucket_dtype)
                 : at::zeros({total}, options);
    next.push_back(std::move(b));
  }
  for (size_t i = 0; i < params_.size(); ++i)
    if (!seen[i]) throw InvalidArgument(strCat(opts_.name, ": parameter ", i, " is in no bucket"));

  // Carry current gradients over into the new buckets (gradient accumulation
  // may span a rebuild), then point .grad at the new views.
  for (size_t i = 0; i < params_.size() && opts_.mode == ReducerMode::kGradients; ++i) {
    Bucket& b = next[bucket_of[i]];
    at::Tensor& grad = params_[i].mutable_grad();
    const at::Tensor view = slotView(b, slot_of[i]);
    if (grad.defined()) view.copy_(grad.reshape(view.sizes()));
    if (b.views && grad.defined()) grad = view;
  }
  buckets_ = std::move(next);
  bucket_of_ = std::move(bucket_of);
  slot_of_ = std::move(slot_of);
  ++generation_;
  std::vector<ReducerBucket> refs;
  for (size_t j = 0; j < buckets_.size(); ++j) refs.push_back(strategyView(j));
  strategy_->layoutChanged(refs);
}

ReducerBucket GradientReducer::strategyView(size_t index) const {
  const Bucket& b = buckets_[index];
  ReducerBucket ref{index, b.flat, params_[b.params[0]].scalar_type(), b.params, b.offsets, {}};
  for (int64_t p : b.params) ref.shapes.push_back(params_[p].sizes().vec());
  return ref;
}

at::Tensor GradientReducer::slotView(const Bucket& b, size_t slot) const {
  const at::Tensor& p = params_[b.params[slot]];
  return b.flat.narrow(0, b.offsets[slot], p.numel()).view(p.sizes());
}

std::vector<int64_t> GradientReducer::readyOrder() {
  std::lock_guard<std::mutex> lock(mu_);
  return recorded_order_ ? ready_order_ : std::vector<int64_t>{};
}

std::vector<at::Tensor> GradientReducer::flats() const {
  std::vector<at::Tensor> out;
  for (const auto& b : buckets_) out.push_back(b.flat);
  return out;
}

std::vector<int64_t> GradientReducer::bucketBytes() const {
  std::vector<int64_t> out;
  for (const auto& b : buckets_) out.push_back(b.flat.numel() * static_cast<int64_t>(b.flat.element_size()));
  return out;
}

void GradientReducer::setSyncEnabled(bool enabled) {
  std::lock_guard<std::mutex> lock(mu_);
  counter_->setLocal(!enabled);
  for (auto& c : param_counters_) c.setLocal(!enabled);
}

bool GradientReducer::passesPending() {
  std::lock_guard<std::mutex> lock(mu_);
  if (opts_.mode == ReducerMode::kGradients) return counter_->pending();
  return std::any_of(param_counters_.begin(), param_counters_.end(), [](const PassCounter& c) { return c.pending(); });
}

void GradientReducer::resetPasses(std::optional<int> passes_per_step) {
  std::lock_guard<std::mutex> lock(mu_);
  counter_->reset(passes_per_step);
  for (auto& c : param_counters_) c.reset(passes_per_step);
}

void GradientReducer::setPassesPerStep(int passes_per_step) {
  std::lock_guard<std::mutex> lock(mu_);
  counter_->setPassesPerStep(passes_per_step);
  for (auto& c : param_counters_) c.setPassesPerStep(passes_per_step);
}

std::string GradientReducer::paramName(size_t index) const {
  return index < opts_.param_names.size() ? opts_.param_names[index] : strCat("parameter ", index);
}

void GradientReducer::beforeGrad(size_t index, const variable_list& grads) {
  bool started = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (opts_.mode == ReducerMode::kDeltas) {
      countParameterPass(index);
    } else if (!pass_active_ || pass_ended_) {
      startPass();
      started = true;
    }
    if (!opts_.sparse_refusal.empty() && !grads.empty() && grads[0].defined() && grads[0].layout() != c10::kStrided)
      throw InvalidArgument(strCat("hvdtorch: rank ", engine_->topo().rank, ": parameter '", paramName(index),
                                   "' got a sparse gradient; ", opts_.sparse_refusal));
  }
  if (started && at_pass_start_) at_pass_start_();  // outside the lock: it may be Python
}

void GradientReducer::setPassCallbacks(std::function<void()> at_start, std::function<void()> after_drop) {
  std::lock_guard<std::mutex> lock(mu_);
  at_pass_start_ = std::move(at_start);
  after_grads_drop_ = std::move(after_drop);
}

void GradientReducer::countParameterPass(size_t index) {
  // A parameter's pass is its one gradient: it begins and ends here; PassLimitError on a (k+1)-th.
  PassCounter& c = param_counters_[index];
  c.setRank(engine_->topo().rank);  // named by the error; an elastic job may renumber ranks
  c.beginPass(paramName(index));
  c.endPass();
}

void GradientReducer::startPass() {
  // Counted first: a pass over the limit raises before anything is touched.
  // The caller sharing the counter may have begun the pass already.
  if (!counter_->inPass()) {
    counter_->setRank(engine_->topo().rank);  // named by the error; an elastic job may renumber ranks
    counter_->beginPass();
  }
  // In explicit mode the caller may skip finalize(); the previous pass's
  // results are then waited for here, before its buckets are reused.
  if (pass_active_ && pass_ended_) waitAll();
  pass_active_ = true;
  pass_ended_ = false;
  reduce_this_pass_ = counter_->reducing();
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.launched = false;
  }
  if (!recorded_order_) ready_order_.clear();
  // Runs once the whole backward pass is done, on the autograd engine's thread.
  torch::autograd::Engine::get_default_engine().queue_callback([this] {
    try {
      endOfBackward();
    } catch (...) {
      rethrowForAutograd(std::current_exception());
    }
  });
}

void GradientReducer::writeSlot(Bucket& b, size_t slot) {
  at::Tensor& grad = params_[b.params[slot]].mutable_grad();
  const at::Tensor view = slotView(b, slot);
  if (!grad.defined()) {
    view.zero_();
  } else if (grad.data_ptr() != view.data_ptr()) {
    view.copy_(grad);  // converts when the bucket has a wire dtype
  }
  if (b.views) grad = view;
}

void GradientReducer::startReductionNow() {
  pass_active_ = true;
  pass_ended_ = true;
  reduce_this_pass_ = true;
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& b : buckets_) b.launched = false;
}

void GradientReducer::onGradReady(size_t index) {
  // One rank: averaging is the identity (prescale x postscale = 1, Sum of
  // one), so gradients stay where autograd put them and nothing runs.
  // Deltas mode: backward only counts (beforeGrad).
  if (lone_identity_ || opts_.mode == ReducerMode::kDeltas) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!pass_active_ || pass_ended_) return;  // the pre-hook did not run (the pass was refused)
  Bucket& b = buckets_[bucket_of_[index]];
  const size_t slot = slot_of_[index];
  if (!reduce_this_pass_) {
    // Accumulating locally: keep .grad a view so later passes add in place.
    if (b.views) writeSlot(b, slot);
    return;
  }
  if (ready_[index]) return;  // a hook may fire twice for a reused accumulator
  ready_[index] = true;
  if (!recorded_order_) ready_order_.push_back(static_cast<int64_t>(index));
  writeSlot(b, slot);
  if (--b.pending == 0 && opts_.pipeline) launch(bucket_of_[index]);
}

void GradientReducer::launch(size_t index) {
  Bucket& b = buckets_[index];
  b.launched = true;
  if (!strategy_->keepsGradients())
    for (int64_t p : b.params) params_[p].mutable_grad() = at::Tensor();  // only a shard comes back
  if (set_size_ == 1) {
    b.op = std::make_unique<LoneBucket>(b.flat, opts_.prescale * opts_.postscale);
    return;
  }
  b.op = strategy_->launch(ctx_, strategyView(index), strCat(opts_.name, ".g", generation_, ".b", index));
}

void GradientReducer::launchRemaining() {
  // Index order, on every rank: parameters without a gradient this pass
  // (unused branches) contribute no new gradient: their .grad so far, or
  // zeros (a slot may still hold last pass's result after .grad was cleared).
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    if (b.launched) continue;
    for (size_t s = 0; s < b.params.size(); ++s) {
      const size_t p = b.params[s];
      if (!ready_[p]) {
        ready_[p] = true;
        writeSlot(b, s);
      }
    }
    launch(i);
  }
}

at::Tensor GradientReducer::decode(Bucket& b, const at::Tensor& result) {
  const at::ScalarType dtype = params_[b.params[0]].scalar_type();
  const at::Tensor out = result.scalar_type() == dtype ? result : result.to(dtype);
  if (!b.views && strategy_->keepsGradients() && opts_.mode == ReducerMode::kGradients) {
    // Wire dtype: the reduced values go back into each .grad.
    for (size_t s = 0; s < b.params.size(); ++s) {
      const at::Tensor& p = params_[b.params[s]];
      at::Tensor& grad = p.mutable_grad();
      const at::Tensor reduced = out.narrow(0, b.offsets[s], p.numel()).view(p.sizes());
      if (grad.defined()) {
        grad.copy_(reduced);
      } else {
        grad = reduced;
      }
    }
  }
  return out;
}

std::vector<at::Tensor> GradientReducer::waitAll() {
  std::exception_ptr error;
  std::vector<at::Tensor> results(buckets_.size());
  for (size_t j = 0; j < buckets_.size(); ++j) {
    Bucket& b = buckets_[j];
    if (!b.op) continue;
    try {
      results[j] = decode(b, b.op->finish());
    } catch (...) {
      if (!error) error = std::current_exception();
    }
    b.op.reset();
  }
  pass_active_ = false;
  if (error) std::rethrow_exception(error);
  return results;
}

void GradientReducer::endOfBackward() {
  bool dropped = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pass_active_ || pass_ended_) return;
    counter_->endPass();
    if (!reduce_this_pass_ || lone_identity_) {
      pass_active_ = false;
      return;
    }
    launchRemaining();
    recorded_order_ = true;
    pass_ended_ = true;
    dropped = !strategy_->keepsGradients();
    if (opts_.sync_on_backward) waitAll();
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
  if (index < 0 || index >= static_cast<int64_t>(buckets_.size()))
    throw InvalidArgument(strCat(opts_.name, ": finishBucket(", index, "): there are ", buckets_.size(), " buckets"));
  if (!strategy_->keepsGradients())
    throw InvalidArgument(strCat(opts_.name, ": finishBucket() needs a strategy that hands gradients back"));
  if (!reducingLocked()) return;
  launchRemaining();
  Bucket& b = buckets_[static_cast<size_t>(index)];
  if (!b.op) return;
  try {
    decode(b, b.op->finish());
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

std::vector<std::vector<int64_t>> GradientReducer::bucketParams() const {
  std::vector<std::vector<int64_t>> out;
  out.reserve(buckets_.size());
  for (const auto& b : buckets_) out.push_back(b.params);
  return out;
}

std::vector<at::Tensor> GradientReducer::synchronize() {
  std::lock_guard<std::mutex> lock(mu_);
  if (opts_.mode == ReducerMode::kDeltas)
    throw InvalidArgument(strCat(opts_.name, ": in deltas mode the reducer reduces what reduceNow() hands it"));
  if (!reducingLocked()) startReductionNow();
  launchRemaining();
  std::vector<at::Tensor> results = waitAll();
  counter_->reset();
  return results;
}

void GradientReducer::reduceNow(const std::vector<at::Tensor>& tensors) {
  std::lock_guard<std::mutex> lock(mu_);
  if (opts_.mode != ReducerMode::kDeltas)
    throw InvalidArgument(strCat(opts_.name, ": reduceNow() is for deltas mode; gradients are reduced by backward"));
  if (tensors.size() != params_.size())
    throw InvalidArgument(
        strCat(opts_.name, ": reduceNow() got ", tensors.size(), " tensors for ", params_.size(), " parameters"));
  for (size_t i = 0; i < params_.size(); ++i)
    if (tensors[i].numel() != params_[i].numel())
      throw InvalidArgument(strCat(opts_.name, ": reduceNow(): tensor ", i, " has ", tensors[i].numel(),
                                   " elements, parameter '", paramName(i), "' ", params_[i].numel()));
  startReductionNow();
  for (size_t j = 0; j < buckets_.size(); ++j) {
    Bucket& b = buckets_[j];
    for (size_t s = 0; s < b.params.size(); ++s) {
      const at::Tensor view = slotView(b, s);
      view.copy_(tensors[b.params[s]].reshape(view.sizes()));  // the codec's encode: converts to the wire dtype
    }
    launch(j);
  }
  const std::vector<at::Tensor> results = waitAll();
  for (size_t j = 0; j < buckets_.size(); ++j) {
    const Bucket& b = buckets_[j];
    for (size_t s = 0; s < b.params.size(); ++s) {
      const at::Tensor& t = tensors[b.params[s]];
      t.copy_(results[j].narrow(0, b.offsets[s], t.numel()).view(t.sizes()));
    }
  }
  for (auto& c : param_counters_) c.reset();
}

void GradientReducer::viewGradients() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Bucket& b : buckets_) {
    if (!b.views || b.op) continue;
    b.flat.zero_();
    for (size_t s = 0; s < b.params.size(); ++s) params_[b.params[s]].mutable_grad() = slotView(b, s);
  }
}

}  // namespace hvdtorch
