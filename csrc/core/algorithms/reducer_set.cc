#include "algorithms/reducer_set.h"

#include <chrono>

#include "common/error.h"

namespace hvdtorch {

namespace {

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

CostModel priors() {
  std::vector<double> alpha, beta;
  for (const ReducerEntry& entry : reducerRegistry()) {
    alpha.push_back(entry.alpha);
    beta.push_back(entry.beta);
  }
  return CostModel(std::move(alpha), std::move(beta));
}

}  // namespace

ReducerSet::ReducerSet(const ReducerEnv& env) : model_(priors()), calibrated_(model_) {
  for (const ReducerEntry& entry : reducerRegistry()) reducers_.push_back(entry.make(env));
}

Reducer& ReducerSet::get(ReducerId id) {
  if (id == kAutoReducer) throw InvalidArgument("reducer 'auto' must be resolved before use");
  if (id >= reducers_.size()) throw InvalidArgument(strCat("unknown reducer id ", int(id)));
  if (!reducers_[id]) throw InvalidArgument(reducerRegistry()[id].unavailable);
  return *reducers_[id];
}

std::vector<ReducerId> ReducerSet::automatic() const {
  std::vector<ReducerId> out;
  for (size_t i = 0; i < reducers_.size(); ++i)
    if (reducers_[i] != nullptr && reducerRegistry()[i].automatic) out.push_back(static_cast<ReducerId>(i));
  return out;
}

std::vector<bool> ReducerSet::candidates(const Context& ctx, DataType dtype, ReduceOp op) const {
  std::vector<bool> c(reducers_.size(), false);
  for (size_t i = 0; i < reducers_.size(); ++i)
    c[i] = reducers_[i] && reducerRegistry()[i].automatic && reducers_[i]->autoCandidate(ctx, dtype, op);
  return c;
}

ReducerId ReducerSet::idOf(const Reducer& reducer) const {
  for (size_t i = 0; i < reducers_.size(); ++i)
    if (reducers_[i].get() == &reducer) return static_cast<ReducerId>(i);
  return kAutoReducer;
}

void ReducerSet::check(ReducerId id, const Context& ctx, DataType dtype, ReduceOp op) const {
  if (id == kAutoReducer) {
    for (bool c : candidates(ctx, dtype, op))
      if (c) return;
    throw InvalidArgument(strCat("no reducer serves ", reduceOpName(op), " on ", dtypeName(dtype)));
  }
  const Reducer& r = get(id);
  if (!r.supports(ctx, dtype, op))
    throw InvalidArgument(strCat("reducer ", r.name(), " does not serve ", reduceOpName(op), " on ", dtypeName(dtype)));
}

ReducerId ReducerSet::forRequest(ReducerId asked, ReduceOp op, const std::function<bool()>& registered_in_place) const {
  const bool sum = op == ReduceOp::kSum || op == ReduceOp::kAverage;
  if (asked == kAutoReducer && sum && available(registeredReducer()) && registered_in_place())
    return registeredReducer();
  return asked;
}

ReducerId ReducerSet::choose(const Context& ctx, size_t bytes, DataType dtype, ReduceOp op) const {
  const std::vector<bool> anchors = candidates(ctx, DataType::kFloat32, ReduceOp::kSum);
  ReducerId best;
  {
    std::lock_guard<std::mutex> lock(mu_);
    best = model_.choose(bytes, candidates(ctx, dtype, op), anchors);
  }
  if (best == kAutoReducer)
    throw InvalidArgument(strCat("no reducer serves ", reduceOpName(op), " on ", dtypeName(dtype)));
  return best;
}

Reducer& ReducerSet::pick(ReducerId id, const Context& ctx, size_t bytes, DataType dtype, ReduceOp op) {
  if (id != kAutoReducer || ctx.size() <= 1) return resolve(id, ctx, bytes, dtype, op);
  const std::vector<bool> anchors = candidates(ctx, DataType::kFloat32, ReduceOp::kSum);
  ReducerId best;
  {
    std::lock_guard<std::mutex> lock(mu_);
    best = model_.pickForRun(bytes, candidates(ctx, dtype, op), anchors);
  }
  if (best == kAutoReducer)
    throw InvalidArgument(strCat("no reducer serves ", reduceOpName(op), " on ", dtypeName(dtype)));
  return get(best);
}

void ReducerSet::allreduce(Context& ctx, Reducer& reducer, void* data, size_t count, DataType dtype, ReduceOp op,
                           const void* in) {
  const auto t0 = std::chrono::steady_clock::now();
  reducer.allreduceInto(ctx, in != nullptr ? in : data, data, count, dtype, op);
  const double seconds = secondsSince(t0);
  record(idOf(reducer), count * dtypeSize(dtype), seconds);
  bool fold_now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fold_now = ++ops_since_fold_ >= fold_period_;
  }
  if (fold_now) agree(ctx);
}

void ReducerSet::record(ReducerId id, size_t bytes, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  model_.observe(id, bytes, seconds);
}

void ReducerSet::agree(Context& ctx) {
  std::vector<double> stats;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats = model_.localStats();
  }
  // Min over ranks: a collective's time on the rank that arrived last is
  // the collective itself; the others' times add how long they waited for
  // it, which is noise from outside the reducer. Any rank-independent
  // reduction would do for agreement. A fixed reducer: the model must not
  // choose how it is agreed.
  RingAllreduce ring;
  ring.allreduce(ctx, stats.data(), stats.size(), DataType::kFloat64, ReduceOp::kMin);
  const std::vector<bool> anchors = candidates(ctx, DataType::kFloat32, ReduceOp::kSum);
  std::lock_guard<std::mutex> lock(mu_);
  const bool learnt = model_.fold(stats, anchors);
  fold_period_ = learnt ? kMinFoldPeriod : std::min(2 * fold_period_, kMaxFoldPeriod);
  ops_since_fold_ = 0;
}

Reducer& ReducerSet::reduceScatterer(const Context& ctx, size_t bytes, DataType dtype, ReduceOp op) {
  std::lock_guard<std::mutex> lock(mu_);
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

void ReducerSet::setLinkPriors(const Context& ctx, const LinkCost& link) {
  std::vector<double> alpha(reducers_.size(), 0.0), beta(reducers_.size(), 0.0);
  for (size_t i = 0; i < reducers_.size(); ++i) {
    if (!reducers_[i] || !link.known()) continue;
    const LinkTraffic t = reducers_[i]->linkTraffic(ctx);
    alpha[i] = link.latency * t.messages;  // linkSeconds() as a line in n
    beta[i] = link.latency * t.messages_per_byte + link.seconds_per_byte * t.bytes_per_byte;
  }
  model_.setLinkPriors(link, std::move(alpha), std::move(beta));
}

void ReducerSet::calibrate(Context& ctx) {
  if (ctx.size() > 1) {
    const LinkCost link = measureLink(ctx);
    {
      std::lock_guard<std::mutex> lock(mu_);
      setLinkPriors(ctx, link);
    }
    std::vector<ReducerId> measured;
    const std::vector<bool> anchors = candidates(ctx, DataType::kFloat32, ReduceOp::kSum);
    for (size_t i = 0; i < reducers_.size(); ++i)
      if (anchors[i] && reducerRegistry()[i].measure_at_init) measured.push_back(static_cast<ReducerId>(i));
    std::vector<float> buf(SizeBands::bytes(kCalibrationBands[std::size(kCalibrationBands) - 1]) / sizeof(float));
    for (size_t band : kCalibrationBands) {
      const size_t count = SizeBands::bytes(static_cast<int>(band)) / sizeof(float);
      for (ReducerId id : measured)  // warm-up: first-use allocations, links, arenas
        reducers_[id]->allreduce(ctx, buf.data(), count, DataType::kFloat32, ReduceOp::kSum);
      // Interleaved, so a burst of load hits every reducer alike.
      for (int rep = 0; rep < kCalibrationReps; ++rep) {
        for (ReducerId id : measured) {
          const auto t0 = std::chrono::steady_clock::now();
          reducers_[id]->allreduce(ctx, buf.data(), count, DataType::kFloat32, ReduceOp::kSum);
          record(id, count * sizeof(float), secondsSince(t0));
        }
      }
    }
    agree(ctx);
  }
  std::lock_guard<std::mutex> lock(mu_);
  calibrated_ = model_;
}

CostModel ReducerSet::model() const {
  std::lock_guard<std::mutex> lock(mu_);
  return model_;
}

void ReducerSet::adoptModel(const CostModel& model, const Context& ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  model_ = model;
  setLinkPriors(ctx, model.link());
  calibrated_ = model_;
}

}  // namespace hvdtorch
