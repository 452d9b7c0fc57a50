#include "algorithms/reducer_set.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"

namespace hvdtorch {

ReducerSet::ReducerSet(const ReducerEnv& env) {
  for (const ReducerEntry& entry : reducerRegistry()) {
    reducers_.push_back(entry.make(env));
    model_.alpha.push_back(entry.alpha);
    model_.beta.push_back(entry.beta);
  }
}

Reducer& ReducerSet::get(ReducerId id) {
  if (id == kAutoReducer) throw InvalidArgument("reducer 'auto' must be resolved before use");
  if (id >= reducers_.size()) throw InvalidArgument(strCat("unknown reducer id ", int(id)));
  if (!reducers_[id]) throw InvalidArgument(reducerRegistry()[id].unavailable);
  return *reducers_[id];
}

void ReducerSet::check(ReducerId id, const Context& ctx, DataType dtype, ReduceOp op) const {
  if (id == kAutoReducer) {
    for (size_t i = 0; i < reducers_.size(); ++i)
      if (reducers_[i] && reducerRegistry()[i].automatic && reducers_[i]->autoCandidate(ctx, dtype, op)) return;
    throw InvalidArgument(strCat("no reducer serves ", reduceOpName(op), " on ", dtypeName(dtype)));
  }
  const Reducer& r = const_cast<ReducerSet*>(this)->get(id);
  if (!r.supports(ctx, dtype, op))
    throw InvalidArgument(strCat("reducer ", r.name(), " does not serve ", reduceOpName(op), " on ", dtypeName(dtype)));
}

ReducerId ReducerSet::choose(const Context& ctx, size_t bytes, DataType dtype, ReduceOp op) const {
  ReducerId best = kAutoReducer;
  double best_t = -1;
  for (size_t i = 0; i < reducers_.size(); ++i) {
    const auto id = static_cast<ReducerId>(i);
    if (!reducers_[i] || !reducerRegistry()[i].automatic || !reducers_[i]->autoCandidate(ctx, dtype, op)) continue;
    const double t = model_.estimate(id, bytes);
    if (best_t < 0 || t < best_t) {
      best = id;
      best_t = t;
    }
  }
  if (best == kAutoReducer)
    throw InvalidArgument(strCat("no reducer serves ", reduceOpName(op), " on ", dtypeName(dtype)));
  return best;
}

Reducer& ReducerSet::reduceScatterer(const Context& ctx, size_t bytes, DataType dtype, ReduceOp op) {
  Reducer* best = nullptr;
  double best_t = -1;
  for (size_t i = 0; i < reducers_.size(); ++i) {
    Reducer* r = reducers_[i].get();
    if (!r || !r->hasReduceScatter(ctx) || !r->supports(ctx, dtype, op)) continue;
    const double t = model_.estimate(static_cast<ReducerId>(i), bytes);
    if (!best || t < best_t) {
      best = r;
      best_t = t;
    }
  }
  if (!best)
    throw InvalidArgument(strCat("no reducer has a reduce-scatter for ", reduceOpName(op), " on ", dtypeName(dtype)));
  return *best;
}

void ReducerSet::calibrate(Context& ctx) {
  if (ctx.size() <= 1) return;
  constexpr size_t kSmall = 8 << 10, kLarge = 4 << 20;
  constexpr int kReps = 3;
  std::vector<char> buf(kLarge, 0);
  std::vector<double> t;  // per reducer: small time, large time (seconds); -1: not measured
  for (size_t i = 0; i < reducers_.size(); ++i) {
    Reducer* r = reducers_[i].get();
    const bool measure = r && reducerRegistry()[i].automatic &&
                         r->autoCandidate(ctx, DataType::kFloat32, ReduceOp::kSum);
    for (size_t bytes : {kSmall, kLarge}) {
      if (!measure) {
        t.push_back(-1);
        continue;
      }
      const size_t count = bytes / sizeof(float);
      r->allreduce(ctx, buf.data(), count, DataType::kFloat32, ReduceOp::kSum);  // warm-up, allocations
      std::vector<double> times;
      for (int k = 0; k < kReps; ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        r->allreduce(ctx, buf.data(), count, DataType::kFloat32, ReduceOp::kSum);
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(times.begin(), times.end());
      t.push_back(times[kReps / 2]);
    }
  }
  // The slowest rank's view decides, identically everywhere.
  RingAllreduce ring;
  ring.allreduce(ctx, t.data(), t.size(), DataType::kFloat64, ReduceOp::kMax);
  for (size_t i = 0; i < reducers_.size(); ++i) {
    const double small = t[2 * i], large = t[2 * i + 1];
    if (small < 0 || large < 0) continue;
    const double beta = std::max(0.0, (large - small) / static_cast<double>(kLarge - kSmall));
    model_.alpha[i] = std::max(1e-7, small - beta * static_cast<double>(kSmall));
    model_.beta[i] = beta;
  }
}

}  // namespace hvdtorch
