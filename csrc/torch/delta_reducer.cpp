#include "delta_reducer.h"

#include <algorithm>

#include "common/error.h"

namespace hvdtorch {

using torch::autograd::variable_list;

namespace {

// The rules every parameter's counter copies: the caller's, or strict over the options' k.
PassCounter counterRules(const std::shared_ptr<PassCounter>& given, int passes_per_step, int rank) {
  PassCounterOptions o;
  o.passes_per_step = passes_per_step;  // checked by the counter (>= 1)
  o.strict = true;
  o.rank = rank;
  PassCounter rules = given ? *given : PassCounter(o);
  rules.reset();
  return rules;
}

}  // namespace

DeltaReducer::DeltaReducer(std::shared_ptr<Engine> engine, std::vector<at::Tensor> params,
                           const std::vector<std::vector<int64_t>>& buckets, GradReducerOptions options,
                           const std::shared_ptr<PassCounter>& counter)
    : set_(std::move(engine), std::move(params), buckets, std::move(options), /*grads=*/false) {
  counters_.assign(set_.params().size(),
                   counterRules(counter, set_.options().backward_passes_per_step, set_.engine()->topo().rank));
  for (size_t i = 0; i < set_.params().size(); ++i)
    hooks_.add(
        set_.params()[i], set_.options().name, i, [this, i](const variable_list& grads) { beforeGrad(i, grads); },
        nullptr);
}

void DeltaReducer::beforeGrad(size_t index, const variable_list& grads) {
  std::lock_guard<std::mutex> lock(mu_);
  // A parameter's pass is its one gradient: it begins and ends here; PassLimitError on a (k+1)-th.
  PassCounter& c = counters_[index];
  c.setRank(set_.engine()->topo().rank);  // named by the error; an elastic job may renumber ranks
  c.beginPass(set_.paramName(index));
  c.endPass();
  const std::string& refusal = set_.options().sparse_refusal;
  if (!refusal.empty() && !grads.empty() && grads[0].defined() && grads[0].layout() != c10::kStrided)
    throw InvalidArgument(strCat("hvdtorch: rank ", set_.engine()->topo().rank, ": parameter '", set_.paramName(index),
                                 "' got a sparse gradient; ", refusal));
}

bool DeltaReducer::passesPending() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::any_of(counters_.begin(), counters_.end(), [](const PassCounter& c) { return c.pending(); });
}

void DeltaReducer::resetPasses(std::optional<int> passes_per_step) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& c : counters_) c.reset(passes_per_step);
}

void DeltaReducer::setPassesPerStep(int passes_per_step) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& c : counters_) c.setPassesPerStep(passes_per_step);
}

void DeltaReducer::reduceNow(const std::vector<at::Tensor>& tensors) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto& params = set_.params();
  const std::string& name = set_.options().name;
  if (tensors.size() != params.size())
    throw InvalidArgument(
        strCat(name, ": reduceNow() got ", tensors.size(), " tensors for ", params.size(), " parameters"));
  for (size_t i = 0; i < params.size(); ++i)
    if (tensors[i].numel() != params[i].numel())
      throw InvalidArgument(strCat(name, ": reduceNow(): tensor ", i, " has ", tensors[i].numel(),
                                   " elements, parameter '", set_.paramName(i), "' ", params[i].numel()));
  auto& buckets = set_.buckets();
  for (size_t j = 0; j < buckets.size(); ++j) {
    BucketSet::Bucket& b = buckets[j];
    for (size_t s = 0; s < b.params.size(); ++s) {
      const at::Tensor view = set_.slotView(b, s);
      view.copy_(tensors[b.params[s]].reshape(view.sizes()));  // the codec's encode: converts to the wire dtype
    }
    set_.launch(j);
  }
  const std::vector<at::Tensor> results = set_.waitAll();
  for (size_t j = 0; j < buckets.size(); ++j) {
    const BucketSet::Bucket& b = buckets[j];
    for (size_t s = 0; s < b.params.size(); ++s) {
      const at::Tensor& t = tensors[b.params[s]];
      t.copy_(results[j].narrow(0, b.offsets[s], t.numel()).view(t.sizes()));
    }
  }
  for (auto& c : counters_) c.reset();
}

}  // namespace hvdtorch
