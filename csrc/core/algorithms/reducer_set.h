// One instance of every registered reducer that can run in this job (each
// keeps persistent scratch memory), and the choice among them.
//
// Reducer `auto` runs, per size band, the reducer the cost model
// (cost_model.h) holds cheapest. The model learns from times measured on
// every rank and made identical across ranks before they count:
//  * calibrate(), at init: across hosts, the link (link_cost.h:
//    measureLink) first, which makes every reducer's prior count its bytes
//    on the wire; then every reducer marked measure_at_init, at 4, 16
//    and 64 KiB (the latency-bound bands, where each op is cheap),
//    kCalibrationReps interleaved repetitions each after a warm-up; a few
//    milliseconds at 2 ranks beyond the links' and arenas' first use. The
//    larger bands, where one op costs up to hundreds of milliseconds, are
//    measured on the real ops (the model's exploration) instead;
//  * online: allreduce() times every all-reduce the executor runs (`auto` or
//    named) into the model, and every fold period-th call, which is the same
//    op on every rank, agree() min-reduces the ranks' statistics and folds
//    them in. The period starts at kMinFoldPeriod and doubles up to
//    kMaxFoldPeriod while folds learn nothing new, so a settled job pays one
//    small extra all-reduce per kMaxFoldPeriod ops.
// A process set's ReducerSet starts from the job's calibrated model
// (calibrated(), fixed once calibrate() returns, so every member adopts the
// same one), with link priors for the set's own topology, and then refines
// its own on its own ops.
//
// Thread-safety: the executor thread runs ops; choose(), model() and the
// other const methods may be called from any thread meanwhile.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "algorithms/cost_model.h"
#include "algorithms/reducer_registry.h"

namespace hvdtorch {

class ReducerSet {
 public:
  static constexpr size_t kCalibrationBands[] = {0, 1, 2};            // 4, 16 and 64 KiB
  static constexpr int kCalibrationReps = CostModel::kMatureSamples;  // so a calibrated band can switch at once
  static constexpr uint32_t kMinFoldPeriod = 8;
  static constexpr uint32_t kMaxFoldPeriod = 1024;

  explicit ReducerSet(const ReducerEnv& env);

  size_t size() const { return reducers_.size(); }
  bool available(ReducerId id) const { return id < reducers_.size() && reducers_[id] != nullptr; }
  // The reducers `auto` may run in this job: available here and marked
  // automatic in the registry, in ReducerId order.
  std::vector<ReducerId> automatic() const;
  // Throws InvalidArgument (the registry's reason) for an unavailable one.
  Reducer& get(ReducerId id);
  const Reducer& get(ReducerId id) const { return const_cast<ReducerSet*>(this)->get(id); }
  // Throws InvalidArgument when `id` (auto included) cannot serve dtype/op
  // here; the message names the reducer and what it lacks.
  void check(ReducerId id, const Context& ctx, DataType dtype, ReduceOp op) const;
  // The reducer a request asking `asked` is negotiated with, from what the op
  // tells about its tensors: `auto` for a Sum (or Average) of a registered
  // buffer reduced in place is the registry's registeredReducer() where it
  // can run here -- it reduces registered buffers in place with no copy on
  // the host, better than any other reducer there, and between hosts it runs
  // the ring; whether it can run depends on HVDTORCH_SHM alone, the same on
  // every rank. Otherwise `asked` (`auto` then picks per unit: choose/pick).
  // `registered_in_place` is asked only where the answer matters (`auto`,
  // Sum or Average): the lookup in the registered memory is not free.
  ReducerId forRequest(ReducerId asked, ReduceOp op, const std::function<bool()>& registered_in_place) const;
  // By ReducerId: may `auto` run it for dtype/op on ctx (available here,
  // automatic, and Reducer::autoCandidate).
  std::vector<bool> candidates(const Context& ctx, DataType dtype, ReduceOp op) const;
  // The reducer `auto` chooses for `bytes` of `dtype`/`op` on this context.
  ReducerId choose(const Context& ctx, size_t bytes, DataType dtype, ReduceOp op) const;
  Reducer& resolve(ReducerId id, const Context& ctx, size_t bytes, DataType dtype, ReduceOp op) {
    return get(id == kAutoReducer ? choose(ctx, bytes, dtype, op) : id);
  }
  // resolve() for an op about to run through allreduce(): `auto` may pick
  // an under-measured reducer instead (the model's exploration). Every rank
  // must call it for the same ops in the same order.
  Reducer& pick(ReducerId id, const Context& ctx, size_t bytes, DataType dtype, ReduceOp op);
  // reducer.allreduce(...), timed into the model; a collective, and at fold
  // points two (agree()). Every rank calls it for the same ops in the same
  // order, as the executor does.
  // `in` (not null): out of place, from `in` into `data` (Reducer::allreduceInto).
  void allreduce(Context& ctx, Reducer& reducer, void* data, size_t count, DataType dtype, ReduceOp op,
                 const void* in = nullptr);
  // The cheapest available reducer with a reduce-scatter on this context.
  Reducer& reduceScatterer(const Context& ctx, size_t bytes, DataType dtype, ReduceOp op);

  // Records one timing of this rank into the model (allreduce() and
  // calibrate() do; public for tests). Every rank records the same ops.
  void record(ReducerId id, size_t bytes, double seconds);
  // Collective: every rank must call it at the same point.
  void calibrate(Context& ctx);
  // Collective: min-reduces every rank's statistics and folds them into the
  // model. allreduce() calls it; public for tests.
  void agree(Context& ctx);
  // A copy of the current model.
  CostModel model() const;
  // The model as calibrate() left it; never changes afterwards.
  const CostModel& calibrated() const { return calibrated_; }
  // Starts from another set's model (a process set takes the job's
  // calibrated()), its link priors redone for `ctx`'s topology: this set's.
  void adoptModel(const CostModel& model, const Context& ctx);

 private:
  ReducerId idOf(const Reducer& reducer) const;
  // Sets model_'s link priors: each reducer's traffic on ctx (Reducer::linkTraffic) over `link`. mu_ held.
  void setLinkPriors(const Context& ctx, const LinkCost& link);

  std::vector<std::unique_ptr<Reducer>> reducers_;  // by ReducerId; null: cannot run here
  mutable std::mutex mu_;                           // guards model_ and the fold schedule
  CostModel model_;
  CostModel calibrated_;
  uint32_t ops_since_fold_ = 0;
  uint32_t fold_period_ = kMinFoldPeriod;
};

}  // namespace hvdtorch
