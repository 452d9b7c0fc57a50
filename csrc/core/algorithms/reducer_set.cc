#include "algorithms/reducer_set.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "common/error.h"

namespace hvdtorch {

ReducerSet::ReducerSet(RingOptions ring, CentralOptions central)
    : ring_(ring), central_(central), native_(&ring_) {
  // Defaults until calibrated: loopback TCP through Gloo costs tens of
  // microseconds per message and about 1 GB/s; the backend's own all-reduce
  // has the lowest latency for tiny messages.
  auto set = [&](ReducerKind k, double a, double b) {
    model_.alpha[static_cast<int>(k)] = a;
    model_.beta[static_cast<int>(k)] = b;
  };
  set(ReducerKind::kAuto, -1, 0);
  set(ReducerKind::kRing, 200e-6, 1.5e-9);
  set(ReducerKind::kNative, 100e-6, 3e-9);
  set(ReducerKind::kCentral, 150e-6, 4e-9);
  set(ReducerKind::kNode, -1, 0);
}

void ReducerSet::setNode(std::unique_ptr<Reducer> node) {
  node_ = std::move(node);
  model_.alpha[static_cast<int>(ReducerKind::kNode)] = node_ ? 20e-6 : -1;
  model_.beta[static_cast<int>(ReducerKind::kNode)] = node_ ? 0.5e-9 : 0;
}

Reducer& ReducerSet::get(ReducerKind kind) {
  switch (kind) {
    case ReducerKind::kRing: return ring_;
    case ReducerKind::kCentral: return central_;
    case ReducerKind::kNative: return native_;
    case ReducerKind::kNode:
      if (!node_)
        throw InvalidArgument("the node reducer needs shared memory, which is off (HVDTORCH_SHM=0)");
      return *node_;
    case ReducerKind::kAuto: break;
  }
  throw InvalidArgument("reducer 'auto' must be resolved before use");
}

void ReducerSet::calibrate(Context& ctx) {
  if (ctx.size() <= 1) return;
  constexpr size_t kSmall = 8 << 10, kLarge = 4 << 20;
  constexpr int kReps = 3;
  const std::vector<ReducerKind> kinds = {ReducerKind::kRing, ReducerKind::kNative, ReducerKind::kCentral,
                                          ReducerKind::kNode};
  std::vector<char> buf(kLarge, 0);
  std::vector<double> t;  // per kind: small time, large time (seconds)
  for (ReducerKind k : kinds) {
    for (size_t bytes : {kSmall, kLarge}) {
      if (!model_.available(k) || (k == ReducerKind::kNative && ctx.native() == nullptr)) {
        t.push_back(-1);
        continue;
      }
      Reducer& r = get(k);
      const size_t count = bytes / sizeof(float);
      r.allreduce(ctx, buf.data(), count, DataType::kFloat32, ReduceOp::kSum);  // warm-up, allocations
      std::vector<double> times;
      for (int i = 0; i < kReps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        r.allreduce(ctx, buf.data(), count, DataType::kFloat32, ReduceOp::kSum);
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(times.begin(), times.end());
      t.push_back(times[kReps / 2]);
    }
  }
  // The slowest rank's view decides, identically everywhere.
  ring_.allreduce(ctx, t.data(), t.size(), DataType::kFloat64, ReduceOp::kMax);
  for (size_t i = 0; i < kinds.size(); ++i) {
    const double small = t[2 * i], large = t[2 * i + 1];
    if (small < 0 || large < 0) continue;
    const double beta = std::max(0.0, (large - small) / static_cast<double>(kLarge - kSmall));
    model_.alpha[static_cast<int>(kinds[i])] = std::max(1e-7, small - beta * static_cast<double>(kSmall));
    model_.beta[static_cast<int>(kinds[i])] = beta;
  }
}

ReducerKind ReducerSet::choose(const Context& ctx, size_t bytes, DataType dtype, ReduceOp op) const {
  ReducerKind best = ReducerKind::kRing;
  double best_t = -1;
  for (ReducerKind k : {ReducerKind::kNode, ReducerKind::kRing, ReducerKind::kNative, ReducerKind::kCentral}) {
    if (!model_.available(k)) continue;
    if (k == ReducerKind::kNative && (ctx.native() == nullptr || !ctx.native()->supports(dtype, op))) continue;
    const double t = model_.estimate(k, bytes);
    if (best_t < 0 || t < best_t) {
      best = k;
      best_t = t;
    }
  }
  return best;
}

}  // namespace hvdtorch
