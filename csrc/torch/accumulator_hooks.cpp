#include "accumulator_hooks.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/error.h"
#include "python_errors.h"

namespace hvdtorch {

using torch::autograd::variable_list;

namespace {

// Raised where compiled autograd asks a hook to describe itself: these run
// only in the eager autograd engine.
[[noreturn]] void refuseCompiledAutograd(const std::string& where) {
  throw std::runtime_error(strCat(
      "hvdtorch: ", where,
      ": compiled autograd met hvdtorch's gradient hooks, which run only in the eager autograd engine. "
      "hvd.DistributedModel hands its gradients to compiled autograd when compiled autograd is already on at its "
      "forward (torch._dynamo.config.compiled_autograd = True, with forward and backward in one torch.compile'd "
      "function, or compiled autograd's context around both); DistributedOptimizer and the sharded optimizer "
      "do not run under compiled autograd: wrap the model in hvd.DistributedModel, or leave compiled autograd off"));
}

class PreHook : public torch::autograd::FunctionPreHook {
 public:
  PreHook(AccumulatorHooks::Before fn, std::string where) : fn_(std::move(fn)), where_(std::move(where)) {}
  variable_list operator()(const variable_list& grads) override {
    try {
      fn_(grads);
    } catch (...) {
      rethrowForAutograd(std::current_exception());
    }
    return grads;
  }
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& /*args*/) const override {
    refuseCompiledAutograd(where_);
  }

 private:
  AccumulatorHooks::Before fn_;
  std::string where_;
};

}  // namespace

void AccumulatorHooks::add(const at::Tensor& param, const std::string& where, size_t index, Before before,
                           After after) {
  if (!param.requires_grad()) throw InvalidArgument(strCat(where, ": parameter ", index, " does not require grad"));
  auto acc = torch::autograd::impl::grad_accumulator(param);
  auto pre = std::make_unique<PreHook>(std::move(before), where);
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
        },
        [where](torch::dynamo::autograd::CompiledNodeArgs& /*args*/) { refuseCompiledAutograd(where); }));
  }
  post_keys_.push_back(key);
  accumulators_.push_back(std::move(acc));
}

AccumulatorHooks::~AccumulatorHooks() { clear(); }

void AccumulatorHooks::clear() {
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    if (post_keys_[i]) accumulators_[i]->del_post_hook(*post_keys_[i]);
    auto& pre = accumulators_[i]->pre_hooks();
    const auto* mine = pre_hooks_[i];
    pre.erase(std::remove_if(pre.begin(), pre.end(), [mine](const auto& h) { return h.get() == mine; }), pre.end());
  }
  accumulators_.clear();
  pre_hooks_.clear();
  post_keys_.clear();
}

}  // namespace hvdtorch
