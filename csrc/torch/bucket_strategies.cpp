#include "bucket_strategies.h"

#include <functional>

#include "algorithms/reducer_registry.h"
#include "common/error.h"
#include "gradients/shard_range.h"
#include "ops/reducescatter.h"
#include "powersgd_strategy.h"
#include "tensor_binding.h"
#include "torch_tensor.h"

namespace hvdtorch {

namespace {

// One engine op in flight; `result` makes the caller's result from the op's outputs.
class EngineOp : public BucketOp {
 public:
  using Result = std::function<at::Tensor(const std::vector<at::Tensor>& outputs)>;
  EngineOp(std::shared_ptr<OpState> state, Result result) : state_(std::move(state)), result_(std::move(result)) {}

  at::Tensor finish() override { return result_(waitForOp(*state_)); }

  void drain(std::chrono::milliseconds timeout) override { state_->waitFor(timeout); }

 private:
  std::shared_ptr<OpState> state_;
  Result result_;
};

class AllreduceViews : public BucketStrategy {
 public:
  const char* name() const override { return "allreduce_views"; }
  bool keepsGradients() const override { return true; }
  bool registeredBuckets() const override { return true; }
  std::unique_ptr<BucketOp> launch(const StrategyContext& ctx, const ReducerBucket& bucket,
                                   const std::string& name) override {
    return allreduceBucket(ctx, bucket, name);
  }
};

class InPlaceShard : public BucketStrategy {
 public:
  const char* name() const override { return "in_place_shard"; }
  bool keepsGradients() const override { return false; }
  bool registeredBuckets() const override { return true; }
  std::unique_ptr<BucketOp> launch(const StrategyContext& ctx, const ReducerBucket& bucket,
                                   const std::string& name) override {
    ops::AllreduceOptions o = ctx.allreduce;
    o.reducer = reducerName(registeredReducer());
    o.fuse = false;  // a fused unit would go through the fusion buffer, which grows to a bucket for good
    const ShardRange mine = shardRange(bucket.flat.numel(), ctx.set_rank, ctx.set_size);
    at::Tensor shard = bucket.flat.narrow(0, mine.start, mine.end - mine.start);
    return std::make_unique<EngineOp>(allreduceInPlace(*ctx.engine, std::move(o), bucket.flat, name),
                                      [shard](const std::vector<at::Tensor>&) { return shard; });
  }
};

class ReduceScatterShard : public BucketStrategy {
 public:
  const char* name() const override { return "reduce_scatter_shard"; }
  bool keepsGradients() const override { return false; }
  // The engine copies a reduce-scatter's input into its fusion buffer whatever memory it is in.
  bool registeredBuckets() const override { return false; }
  std::unique_ptr<BucketOp> launch(const StrategyContext& ctx, const ReducerBucket& bucket,
                                   const std::string& name) override {
    ops::ReducescatterOptions o;
    o.name = name;
    o.op = ctx.allreduce.op;
    o.prescale = ctx.allreduce.prescale;
    o.postscale = ctx.allreduce.postscale;
    o.process_set_id = ctx.allreduce.process_set_id;
    OpBinding binding(strCat("rank ", ctx.engine->topo().rank, ": reducescatter '", name, "'"));
    o.inputs = {binding.bind(bucket.flat)};
    o.allocate = binding.allocatorLike(bucket.flat);
    const int64_t handle = ops::reducescatter(*ctx.engine, std::move(o));
    auto state = ctx.engine->state(handle);
    ctx.engine->release(handle);
    return std::make_unique<EngineOp>(std::move(state),
                                      [](const std::vector<at::Tensor>& outputs) { return outputs.at(0); });
  }
};

// Adasum's coefficients come from dot products over one tensor, so a bucket
// fused into one vector would give other values: one op whose tensors are
// the bucket's slots, each reduced on its own (the engine never fuses Adasum).
// Otherwise allreduce_views: in place, the whole bucket comes back.
class AdasumPerTensor : public AllreduceViews {
 public:
  const char* name() const override { return "adasum"; }
  bool registeredBuckets() const override { return false; }  // no in-place node reducer for Adasum
  std::unique_ptr<BucketOp> launch(const StrategyContext& ctx, const ReducerBucket& bucket,
                                   const std::string& name) override {
    ops::AllreduceOptions o = ctx.allreduce;
    o.name = name;
    o.op = ReduceOp::kAdasum;
    OpBinding binding(strCat("rank ", ctx.engine->topo().rank, ": allreduce '", name, "'"));
    for (size_t s = 0; s < bucket.params.size(); ++s) {
      int64_t numel = 1;
      for (int64_t d : bucket.shapes[s]) numel *= d;
      TensorPtr slot = binding.bind(bucket.flat.narrow(0, bucket.offsets[s], numel));
      o.inputs.push_back(slot);
      o.outputs.push_back(std::move(slot));
    }
    const int64_t handle = ops::allreduce(*ctx.engine, std::move(o));
    auto state = ctx.engine->state(handle);
    ctx.engine->release(handle);
    at::Tensor flat = bucket.flat;
    return std::make_unique<EngineOp>(std::move(state), [flat](const std::vector<at::Tensor>&) { return flat; });
  }
};

}  // namespace

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

std::unique_ptr<BucketStrategy> makeBucketStrategy(const std::string& name) {
  if (name == "allreduce_views") return std::make_unique<AllreduceViews>();
  if (name == "in_place_shard") return std::make_unique<InPlaceShard>();
  if (name == "reduce_scatter_shard") return std::make_unique<ReduceScatterShard>();
  if (name == "powersgd") return std::make_unique<PowerSGDStrategy>(PowerSGDOptions{});
  if (name == "adasum") return std::make_unique<AdasumPerTensor>();
  throw InvalidArgument(strCat("hvdtorch: unknown bucket strategy '", name,
                               "' (allreduce_views, in_place_shard, reduce_scatter_shard, powersgd or adasum)"));
}

}  // namespace hvdtorch
