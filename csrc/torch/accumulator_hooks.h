// Hooks on the gradient accumulators of a list of parameters, removed when
// this object goes: the reducers' way into autograd (grad_reducer.h,
// delta_reducer.h). Holding the accumulators keeps the nodes, and so the
// hooks, alive as long as their owner.
//
// Compiled autograd cannot trace C++ hooks: where it meets one it raises the
// error refuseCompiledAutograd() words (what works instead), not torch's
// bare "compiled_args nyi". DistributedModel removes these hooks (clear())
// and drives its reducer from hooks compiled autograd traces
// (hvdtorch/training/compiled_model.py).
#pragma once

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace hvdtorch {

// The accumulator handle is std::shared_ptr<Node> in torch 2.11 and
// c10::intrusive_ptr<Node> in 2.13: take whatever this torch returns.
using AccumulatorPtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::autograd::Variable&>()));

class AccumulatorHooks {
 public:
  // Runs before the accumulator adds a gradient to .grad, with the incoming gradients.
  using Before = std::function<void(const torch::autograd::variable_list& grads)>;
  // Runs once the accumulator has written .grad.
  using After = std::function<void()>;

  AccumulatorHooks() = default;
  ~AccumulatorHooks();
  AccumulatorHooks(const AccumulatorHooks&) = delete;
  AccumulatorHooks& operator=(const AccumulatorHooks&) = delete;

  // Hooks `param`'s accumulator (InvalidArgument naming `where` and the
  // parameter's index `index` when it does not require grad). `after` may be
  // empty. Errors thrown by either go through rethrowForAutograd.
  void add(const at::Tensor& param, const std::string& where, size_t index, Before before, After after);
  // Removes every hook added so far.
  void clear();

 private:
  std::vector<AccumulatorPtr> accumulators_;
  std::vector<const torch::autograd::FunctionPreHook*> pre_hooks_;
  std::vector<std::optional<uintptr_t>> post_keys_;
};

}  // namespace hvdtorch
