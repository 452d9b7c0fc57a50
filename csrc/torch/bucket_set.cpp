#include "bucket_set.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "gradients/bucket_packing.h"
#include "output_pool.h"
#include "registered_tensor.h"
#include "strategies/registry.h"
#include "torch_tensor.h"

namespace hvdtorch {

namespace {

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

BucketSet::BucketSet(std::shared_ptr<Engine> engine, std::vector<at::Tensor> params,
                     const std::vector<std::vector<int64_t>>& layout, GradReducerOptions options, bool grads)
    : engine_(std::move(engine)),
      params_(std::move(params)),
      opts_(std::move(options)),
      grads_(grads),
      strategy_(opts_.strategy_instance ? opts_.strategy_instance
                                        : std::shared_ptr<BucketStrategy>(makeBucketStrategy(opts_.strategy))) {
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
  if (opts_.release_buckets && std::string(strategy_->name()) != "reduce_scatter_shard")
    throw InvalidArgument(strCat(opts_.name, ": release_buckets needs the reduce_scatter_shard strategy, not ",
                                 strategy_->name(), " (which may keep or reuse a bucket after its op)"));
  if (opts_.unused != "" && opts_.unused != "leave" && opts_.unused != "report")
    throw InvalidArgument(strCat(opts_.name, ": unused is \"\", \"leave\" or \"report\", not \"", opts_.unused, "\""));
  if (opts_.unused == "leave" && !strategy_->keepsGradients())
    throw InvalidArgument(
        strCat(opts_.name, ": unused=\"leave\" needs a strategy that keeps gradients, not ", strategy_->name()));
  rebuild(layout);
  // Bad options (an unknown or unavailable reducer, say) fail here, not in
  // the first backward pass.
  ops::AllreduceOptions probe = ctx_.allreduce;
  probe.name = opts_.name;
  for (const auto& b : buckets_) {
    const at::Tensor t = b.flat.defined() ? b.flat : at::zeros({1}, b.options);  // released: its dtype and device
    probe.inputs.push_back(std::make_shared<TorchTensor>(t, toDataType(t.scalar_type(), opts_.name)));
  }
  probe.outputs = probe.inputs;  // in place, as the buckets are reduced
  ops::allreduceArgs(*engine_, probe);
}

BucketSet::~BucketSet() {
  // One deadline for all the buckets, not one each: a reducer dropped with many buckets in flight after a
  // peer is gone (an exception unwinding every rank) waits the timeout once, not once per bucket.
  const auto deadline = std::chrono::steady_clock::now() + engine_->config().timeout + std::chrono::seconds(5);
  for (auto& b : buckets_) {
    if (!b.op) continue;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    b.op->drain(std::max(left, std::chrono::milliseconds(0)));
  }
}

std::string BucketSet::paramName(size_t index) const {
  return index < opts_.param_names.size() ? opts_.param_names[index] : strCat("parameter ", index);
}

void BucketSet::rebuild(const std::vector<std::vector<int64_t>>& layout) {
  std::vector<bool> seen(params_.size(), false);
  std::vector<Bucket> next;
  std::vector<size_t> bucket_of(params_.size()), slot_of(params_.size());
  for (const auto& members : layout) {
    if (members.empty()) continue;
    Bucket b;
    const at::ScalarType dtype = params_[members[0]].scalar_type();
    const at::ScalarType bucket_dtype = wireScalarType(opts_.codec, dtype);
    b.views = bucket_dtype == dtype && grads_;  // deltas leave .grad alone
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
    // CPU buckets live in registered memory where the strategy reduces them
    // in place: the node reducer then needs no copy through the node arena.
    const at::TensorOptions options = params_[members[0]].options().dtype(bucket_dtype).requires_grad(false);
    b.numel = packing.numel;
    b.options = options;
    b.param_dtype = dtype;
    if (opts_.release_buckets) {
      b.views = false;  // nothing may point into a tensor that is dropped after the reduction
    } else {
      b.flat = options.device().is_cpu() && strategy_->registeredBuckets()
                   ? registeredZeros(*engine_, packing.numel, bucket_dtype)
                   : at::zeros({packing.numel}, options);
    }
    next.push_back(std::move(b));
  }
  for (size_t i = 0; i < params_.size(); ++i)
    if (!seen[i]) throw InvalidArgument(strCat(opts_.name, ": parameter ", i, " is in no bucket"));

  // Carry current gradients over into the new buckets (gradient accumulation
  // may span a rebuild), then point .grad at the new views.
  for (size_t i = 0; i < params_.size() && grads_ && !opts_.release_buckets; ++i) {
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

void BucketSet::leaveGradients() {
  grads_ = false;
  rebuild(bucketParams());
}

ReducerBucket BucketSet::strategyView(size_t index) const {
  const Bucket& b = buckets_[index];
  ReducerBucket ref{index, b.flat, b.param_dtype, b.params, b.offsets, {}};
  for (int64_t p : b.params) ref.shapes.push_back(params_[p].sizes().vec());
  return ref;
}

at::Tensor BucketSet::slotView(const Bucket& b, size_t slot) const {
  const at::Tensor& p = params_[b.params[slot]];
  return b.flat.narrow(0, b.offsets[slot], p.numel()).view(p.sizes());
}

void BucketSet::hold(Bucket& b) {
  if (b.flat.defined()) return;
  // Uninitialized: every slot is written before the bucket is launched (packing leaves no gaps). On the
  // host from the output pool, which keeps a released bucket's pages for the next one (a fresh block of
  // a few MiB is faulted in page by page every pass).
  b.flat = b.options.device().is_cpu() ? OutputPool::instance().empty({b.numel}, b.options.dtype().toScalarType())
                                       : at::empty({b.numel}, b.options);
}

void BucketSet::collectFinished() {
  if (!opts_.release_buckets) return;
  for (Bucket& b : buckets_) {
    if (!b.op || !b.op->done()) continue;
    try {
      b.early = decode(b, b.op->finish());
    } catch (...) {
      b.early_error = std::current_exception();  // raised by waitAll(), with the others
    }
    b.op.reset();
    b.flat = at::Tensor();
  }
}

void BucketSet::launch(size_t index) {
  Bucket& b = buckets_[index];
  hold(b);
  b.launched = true;
  if (!strategy_->keepsGradients())
    for (int64_t p : b.params) params_[p].mutable_grad() = at::Tensor();  // only a shard comes back
  if (set_size_ == 1) {
    b.op = std::make_unique<LoneBucket>(b.flat, opts_.prescale * opts_.postscale);
    return;
  }
  b.op = strategy_->launch(ctx_, strategyView(index), strCat(opts_.name, ".g", generation_, ".b", index));
}

at::Tensor BucketSet::decode(Bucket& b, const at::Tensor& result) {
  const at::ScalarType dtype = b.param_dtype;
  const at::Tensor out = result.scalar_type() == dtype ? result : result.to(dtype);
  if (!b.views && strategy_->keepsGradients() && grads_) {
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

std::vector<at::Tensor> BucketSet::waitAll() {
  std::exception_ptr error;
  std::vector<at::Tensor> results(buckets_.size());
  for (size_t j = 0; j < buckets_.size(); ++j) {
    Bucket& b = buckets_[j];
    if (b.early_error && !error) error = b.early_error;
    results[j] = std::move(b.early);
    b.early = at::Tensor();
    b.early_error = nullptr;
    if (b.op) {
      try {
        results[j] = decode(b, b.op->finish());
      } catch (...) {
        if (!error) error = std::current_exception();
      }
      b.op.reset();
    }
    if (opts_.release_buckets) b.flat = at::Tensor();
  }
  if (error) std::rethrow_exception(error);
  return results;
}

std::vector<at::Tensor> BucketSet::flats() const {
  std::vector<at::Tensor> out;
  for (const auto& b : buckets_) out.push_back(b.flat);
  return out;
}

std::vector<std::vector<int64_t>> BucketSet::bucketParams() const {
  std::vector<std::vector<int64_t>> out;
  out.reserve(buckets_.size());
  for (const auto& b : buckets_) out.push_back(b.params);
  return out;
}

std::vector<int64_t> BucketSet::bucketBytes() const {
  std::vector<int64_t> out;
  for (const auto& b : buckets_)
    out.push_back(b.numel * static_cast<int64_t>(c10::elementSize(b.options.dtype().toScalarType())));
  return out;
}

}  // namespace hvdtorch
