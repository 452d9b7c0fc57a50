// One instance of every registered reducer that can run in this job (each
// keeps persistent scratch memory), and the choice among them.
//
// The `auto` rule is an alpha-beta cost model: for each candidate reducer the
// time of an n-byte all-reduce is estimated as alpha + beta·n, and the
// cheapest candidate wins. calibrate() measures every automatic reducer at
// two sizes on the real transports at init and fits alpha and beta; the times
// are max-reduced over ranks first, so every rank holds the same model and
// makes the same choice (they must: all ranks run the same reducer). Without
// calibration, the registry's defaults apply.
#pragma once

#include <memory>
#include <vector>

#include "algorithms/reducer_registry.h"

namespace hvdtorch {

struct CostModel {
  // Seconds and seconds per byte, indexed by ReducerId.
  std::vector<double> alpha;
  std::vector<double> beta;
  double estimate(ReducerId id, size_t bytes) const { return alpha[id] + beta[id] * static_cast<double>(bytes); }
};

class ReducerSet {
 public:
  explicit ReducerSet(const ReducerEnv& env);

  size_t size() const { return reducers_.size(); }
  bool available(ReducerId id) const { return id < reducers_.size() && reducers_[id] != nullptr; }
  // Throws InvalidArgument (the registry's reason) for an unavailable one.
  Reducer& get(ReducerId id);
  // Throws InvalidArgument when `id` (auto included) cannot serve dtype/op
  // here; the message names the reducer and what it lacks.
  void check(ReducerId id, const Context& ctx, DataType dtype, ReduceOp op) const;
  // The reducer `auto` chooses for `bytes` of `dtype`/`op` on this context.
  ReducerId choose(const Context& ctx, size_t bytes, DataType dtype, ReduceOp op) const;
  Reducer& resolve(ReducerId id, const Context& ctx, size_t bytes, DataType dtype, ReduceOp op) {
    return get(id == kAutoReducer ? choose(ctx, bytes, dtype, op) : id);
  }
  // The cheapest available reducer with a reduce-scatter on this context.
  Reducer& reduceScatterer(const Context& ctx, size_t bytes, DataType dtype, ReduceOp op);

  // Collective: every rank must call it at the same point.
  void calibrate(Context& ctx);
  CostModel& model() { return model_; }
  const CostModel& model() const { return model_; }
  // Takes another set's calibration (a process set reuses the job's).
  void adoptModel(const CostModel& model) { model_ = model; }

 private:
  std::vector<std::unique_ptr<Reducer>> reducers_;  // by ReducerId; null: cannot run here
  CostModel model_;
};

}  // namespace hvdtorch
