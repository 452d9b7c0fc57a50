#include "accumulator_hooks.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <algorithm>

#include "common/error.h"
#include "python_errors.h"

namespace hvdtorch {

using torch::autograd::variable_list;

namespace {

class PreHook : public torch::autograd::FunctionPreHook {
 public:
  explicit PreHook(AccumulatorHooks::Before fn) : fn_(std::move(fn)) {}
  variable_list operator()(const variable_list& grads) override {
    try {
      fn_(grads);
    } catch (...) {
      rethrowForAutograd(std::current_exception());
    }
    return grads;
  }

 private:
  AccumulatorHooks::Before fn_;
};

}  // namespace

void AccumulatorHooks::add(const at::Tensor& param, const std::string& where, size_t index, Before before,
                           After after) {
  if (!param.requires_grad()) throw InvalidArgument(strCat(where, ": parameter ", index, " does not require grad"));
  auto acc = torch::autograd::impl::grad_accumulator(param);
  auto pre = std::make_unique<PreHook>(std::move(before));
  pre_hooks_.push_back(pre.get());
  acc->add_pre_hook(std::move(pre));
  std::optional<uintptr_t> key;
  if (after) {
    key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [after = std::move(after)](const variable_list& outputs, const variable_list& /*inputs*/) {
          try {
            after();
          } catch (...) {
            rethrowForAutograd(std::current_exception());
          }
          return outputs;
        }));
  }
  post_keys_.push_back(key);
  accumulators_.push_back(std::move(acc));
}

AccumulatorHooks::~AccumulatorHooks() {
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    if (post_keys_[i]) accumulators_[i]->del_post_hook(*post_keys_[i]);
    auto& pre = accumulators_[i]->pre_hooks();
    const auto* mine = pre_hooks_[i];
    pre.erase(std::remove_if(pre.begin(), pre.end(), [mine](const auto& h) { return h.get() == mine; }), pre.end());
  }
}

}  // namespace hvdtorch
