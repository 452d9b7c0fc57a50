// What strategies build on: engine ops submitted on a bucket's tensors and
// waited for, and the op in flight they hand the reducer back.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/op_state.h"
#include "ops/allreduce.h"
#include "strategies/bucket_strategy.h"

namespace hvdtorch {

// Submits an all-reduce of `flat` in place (`o`: the reducer's options, less
// name and tensors), bound on this thread; the op's state (the engine's
// handle is released: wait on the state).
std::shared_ptr<OpState> allreduceInPlace(Engine& engine, ops::AllreduceOptions o, const at::Tensor& flat,
                                          const std::string& name);
// Waits for the op; CollectiveError when it failed. Orders this thread's
// stream after it; returns its outputs.
std::vector<at::Tensor> waitForOp(OpState& state);
// The "allreduce_views" reduction of one bucket: in place, the whole bucket comes back.
std::unique_ptr<BucketOp> allreduceBucket(const StrategyContext& ctx, const ReducerBucket& bucket,
                                          const std::string& name);

// One engine op in flight; `result` makes the caller's result from the op's outputs.
class EngineOp : public BucketOp {
 public:
  using Result = std::function<at::Tensor(const std::vector<at::Tensor>& outputs)>;
  EngineOp(std::shared_ptr<OpState> state, Result result) : state_(std::move(state)), result_(std::move(result)) {}

  at::Tensor finish() override { return result_(waitForOp(*state_)); }

  void drain(std::chrono::milliseconds timeout) override { state_->waitFor(timeout); }
  bool done() const override { return state_->done(); }

 private:
  std::shared_ptr<OpState> state_;
  Result result_;
};

}  // namespace hvdtorch
