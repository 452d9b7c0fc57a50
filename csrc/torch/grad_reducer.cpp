#include "grad_reducer.h"

#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include "common/error.h"
#include "python_errors.h"
#include "registered_tensor.h"
#include "tensor_binding.h"
#include "torch_tensor.h"

namespace hvdtorch {

using torch::autograd::variable_list;

namespace {

PassCounter cyclicCounter(int passes_per_step, int rank) {
  PassCounterOptions o;
  o.passes_per_step = passes_per_step;  // checked by the counter (>= 1)
  o.strict = false;
  o.rank = rank;
  return PassCounter(o);
}

}  // namespace

at::ScalarType wireScalarType(WireCodec codec, at::ScalarType dtype) {
  if (codec == WireCodec::kNone) return dtype;
  DataType t{};
  try {
    t = toDataType(dtype, "wire dtype");
  } catch (const InvalidArgument&) {
    return dtype;  // a dtype hvdtorch does not carry (complex, say): as it is
  }
  return toScalarType(wireDtype(codec, t));
}

GradientReducer::GradientReducer(std::shared_ptr<Engine> engine, std::vector<at::Tensor> params,
                                 std::vector<std::vector<int64_t>> buckets, GradReducerOptions options)
    : engine_(std::move(engine)),
      params_(std::move(params)),
      opts_(std::move(options)),
      passes_(cyclicCounter(opts_.backward_passes_per_step, engine_->topo().rank)) {
  if (opts_.op != ReduceOp::kAverage && opts_.op != ReduceOp::kSum && opts_.op != ReduceOp::kAdasum)
    throw InvalidArgument(
        strCat(opts_.name, ": gradients are reduced with Average, Sum or Adasum, not ", reduceOpName(opts_.op)));
  allreduce_.op = opts_.op;
  allreduce_.prescale = opts_.prescale;
  allreduce_.postscale = opts_.postscale;
  const bool cpu = params_.empty() || params_.front().device().is_cpu();
  allreduce_.reducer = ops::bucketReducer(*engine_, opts_.reducer, opts_.op, cpu);
  allreduce_.fuse = opts_.fuse;
  allreduce_.process_set_id = opts_.process_set_id;
  const auto set = engine_->processSet(opts_.process_set_id);
  if (!set || !set->member())
    throw InvalidArgument(strCat(opts_.name, ": process set ", opts_.process_set_id,
                                 set ? " does not include this rank" : " does not exist"));
  set_size_ = static_cast<int>(set->ranks.size());
  ready_.assign(params_.size(), false);
  rebuild(buckets);
  // Bad options (an unknown or unavailable reducer, say) fail here, not in
  // the first backward pass.
  ops::AllreduceOptions probe = allreduce_;
  probe.name = opts_.name;
  for (const auto& b : buckets_)
    probe.inputs.push_back(std::make_shared<TorchTensor>(b.flat, toDataType(b.flat.scalar_type(), opts_.name)));
  ops::allreduceArgs(*engine_, probe);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].requires_grad())
      throw InvalidArgument(strCat(opts_.name, ": parameter ", i, " does not require grad"));
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
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
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
  // Never leave the engine writing into buckets we are about to free.
  for (auto& b : buckets_)
    if (b.state) b.state->waitFor(engine_->config().timeout + std::chrono::seconds(5));
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
    b.views = bucket_dtype == dtype;
    int64_t total = 0;
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
      b.offsets.push_back(total);
      total += params_[idx].numel();
    }
    // CPU buckets live in registered memory: the node reducer then reduces
    // them in place (no copy through the node arena).
    const at::TensorOptions options = params_[members[0]].options().dtype(bucket_dtype).requires_grad(false);
    b.flat = options.device().is_cpu() ? registeredZeros(*engine_, total, bucket_dtype) : at::zeros({total}, options);
    next.push_back(std::move(b));
  }
  for (size_t i = 0; i < params_.size(); ++i)
    if (!seen[i]) throw InvalidArgument(strCat(opts_.name, ": parameter ", i, " is in no bucket"));

  // Carry current gradients over into the new buckets (gradient accumulation
  // may span a rebuild), then point .grad at the new views.
  for (size_t i = 0; i < params_.size(); ++i) {
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
}

at::Tensor GradientReducer::slotView(const Bucket& b, size_t slot) const {
  const at::Tensor& p = params_[b.params[slot]];
  return b.flat.narrow(0, b.offsets[slot], p.numel()).view(p.sizes());
}

std::vector<int64_t> GradientReducer::readyOrder() {
  std::lock_guard<std::mutex> lock(mu_);
  return recorded_order_ ? ready_order_ : std::vector<int64_t>{};
}

std::vector<int64_t> GradientReducer::bucketBytes() const {
  std::vector<int64_t> out;
  for (const auto& b : buckets_) out.push_back(b.flat.numel() * static_cast<int64_t>(b.flat.element_size()));
  return out;
}

void GradientReducer::setSyncEnabled(bool enabled) {
  std::lock_guard<std::mutex> lock(mu_);
  passes_.setLocal(!enabled);
}

void GradientReducer::startPass() {
  pass_active_ = true;
  pass_ended_ = false;
  reduce_this_pass_ = passes_.beginPass();
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

void GradientReducer::onGradReady(size_t index) {
  // One rank: averaging is the identity (prescale x postscale = 1, Sum of
  // one), so gradients stay where autograd put them and nothing runs.
  if (set_size_ == 1 && opts_.prescale * opts_.postscale == 1.0) return;
  std::lock_guard<std::mutex> lock(mu_);
  // In explicit mode the caller may skip finalize(); the previous pass's
  // results are then waited for here, before its buckets are reused.
  if (pass_active_ && pass_ended_) waitAll();
  if (!pass_active_) startPass();
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
  ops::AllreduceOptions o = allreduce_;
  o.name = strCat(opts_.name, ".g", generation_, ".b", index);
  // Bound on this thread: in a gradient hook, the current stream is the one
  // backward wrote the gradients on, which the op's ready event follows.
  OpBinding binding(strCat("rank ", engine_->topo().rank, ": allreduce '", o.name, "'"));
  TensorPtr buf = binding.bind(b.flat);
  o.inputs = {buf};
  o.outputs = {std::move(buf)};
  const int64_t handle = ops::allreduce(*engine_, std::move(o));
  b.state = engine_->state(handle);
  engine_->release(handle);  // we wait on the state itself
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
  recorded_order_ = true;
}

void GradientReducer::waitAll() {
  std::string error;
  for (auto& b : buckets_) {
    if (!b.state) continue;
    while (!b.state->waitFor(std::chrono::milliseconds(1000))) {
    }
    if (!b.state->error().empty() && error.empty()) error = b.state->error();
    if (b.state->error().empty()) collectOutputs(*b.state);  // orders this thread's stream after the op
    if (!b.views && b.state->error().empty()) {
      // Wire dtype: convert the reduced values back into each .grad.
      for (size_t s = 0; s < b.params.size(); ++s) {
        at::Tensor& grad = params_[b.params[s]].mutable_grad();
        const at::Tensor reduced = slotView(b, s).to(params_[b.params[s]].scalar_type());
        if (grad.defined()) {
          grad.copy_(reduced);
        } else {
          grad = reduced;
        }
      }
    }
    b.state.reset();
  }
  pass_active_ = false;
  if (!error.empty()) throw CollectiveError(error);
}

void GradientReducer::endOfBackward() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!pass_active_) return;
  passes_.endPass();
  if (!reduce_this_pass_) {
    pass_active_ = false;
    return;
  }
  launchRemaining();
  pass_ended_ = true;
  if (opts_.sync_on_backward) waitAll();
}

void GradientReducer::finalize() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!pass_active_ || !reduce_this_pass_) return;
  launchRemaining();
  waitAll();
}

}  // namespace hvdtorch
