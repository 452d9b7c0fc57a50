#include "strategies/engine_ops.h"

#include "common/error.h"
#include "tensor_binding.h"
#include "torch_tensor.h"

namespace hvdtorch {

std::shared_ptr<OpState> allreduceInPlace(Engine& engine, ops::AllreduceOptions o, const at::Tensor& flat,
                                          const std::string& name) {
  o.name = name;
  // Bound on this thread: in a gradient hook, the current stream is the one
  // backward wrote the gradients on, which the op's ready event follows.
  OpBinding binding(strCat("rank ", engine.topo().rank, ": allreduce '", name, "'"));
  TensorPtr buf = binding.bind(flat);
  o.inputs = {buf};
  o.outputs = {std::move(buf)};
  const int64_t handle = ops::allreduce(engine, std::move(o));
  auto state = engine.state(handle);
  engine.release(handle);  // we wait on the state itself
  return state;
}

std::vector<at::Tensor> waitForOp(OpState& state) {
  while (!state.waitFor(std::chrono::milliseconds(1000))) {
  }
  if (!state.error().empty()) throw CollectiveError(state.error());
  return collectOutputs(state);  // orders this thread's stream after the op
}

std::unique_ptr<BucketOp> allreduceBucket(const StrategyContext& ctx, const ReducerBucket& bucket,
                                          const std::string& name) {
  at::Tensor flat = bucket.flat;
  return std::make_unique<EngineOp>(allreduceInPlace(*ctx.engine, ctx.allreduce, flat, name),
                                    [flat](const std::vector<at::Tensor>&) { return flat; });
}

}  // namespace hvdtorch
