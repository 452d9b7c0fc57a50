// Which way `auto` runs an all-reduce of device tensors, from times
// measured on this job's devices (the device calibration, run by
// DeviceRouter, device_router.h), identical on every rank.
//
// The routes: the backend's device collectives (NCCL on CUDA), the device
// ring (device_ring.h), and staging through pinned host memory to a host
// reducer. A way is a route and, for staging, the host reducer it stages
// to: the calibration times staging once per host reducer `auto` may run,
// since which one reduces the staged segments changes the route's time
// several-fold at small sizes. Which routes apply is decided collectively,
// so it is alike on every rank; so is the rule's route, the one `auto`
// takes where nothing was measured (the device collectives where they
// serve, the device ring on one host where they do not, staging otherwise).
//
// The model holds, per way and probe size, the agreed seconds of one
// all-reduce (each rank's median of its repetitions, min-reduced over
// ranks as the host cost model does: the rank that arrived last timed the
// collective without waiting). estimate() interpolates linearly between
// probe sizes, holds the smallest probe's time below it (latency-bound)
// and scales the largest probe's time by size above it (bandwidth-bound).
// choose() takes the rule's route, on its fastest measured way, unless
// another way is faster by kSwitchMargin and kMinGainSeconds: ways within
// measurement noise of each other do not swap places from run to run, and
// the way taken is never more than 1 / (1 - kSwitchMargin) of the fastest
// measured one at any size (the 10% `auto` promises).
//
// Pure and deterministic: every rank that folds the same agreed times
// chooses the same way for the same op.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "algorithms/reducer.h"

namespace hvdtorch {

enum class DeviceRoute : int { kNative = 0, kRing = 1, kStaged = 2 };
const char* deviceRouteName(DeviceRoute route);

// One way to run the all-reduce: a route and, for kStaged, the host reducer
// it stages to (kAutoReducer: the host cost model's choice, which is what
// the rule's staged route runs where nothing was measured).
struct DeviceWay {
  DeviceRoute route = DeviceRoute::kStaged;
  ReducerId host = kAutoReducer;
  bool operator==(const DeviceWay& o) const { return route == o.route && host == o.host; }
};

class DeviceRouteModel {
 public:
  static constexpr double kSwitchMargin = 0.08;
  static constexpr double kMinGainSeconds = 2e-6;

  struct Timed {
    DeviceWay way;
    std::vector<double> seconds;  // one agreed time per probe size
  };

  // `sizes` ascending (bytes), each way timed at every size; a way whose
  // times are < 0 was not measured (it is then never chosen). Throws
  // InvalidArgument for empty or unordered sizes, or a way with another
  // number of times.
  DeviceRouteModel(std::vector<size_t> sizes, std::vector<Timed> ways);

  // Estimated seconds of `way` for `bytes`; < 0 where not measured.
  double estimate(const DeviceWay& way, size_t bytes) const;
  // The way for `bytes` among the measured ways `serves` accepts (those
  // that apply and serve this op's dtype and reduction): the rule's route on
  // its fastest measured way, unless another way beats it by the margin and
  // the minimum gain. Where the rule's route has no measured way that
  // serves, {rule, kAutoReducer}: nothing to compare with.
  DeviceWay choose(size_t bytes, const std::function<bool(const DeviceWay&)>& serves, DeviceRoute rule) const;

  const std::vector<size_t>& sizes() const { return sizes_; }
  const std::vector<Timed>& ways() const { return ways_; }
  // One line for the log: each measured way's milliseconds per probe size
  // (staging named with its reducer, "staged:node").
  std::string describe() const;

 private:
  double estimate(const Timed& timed, size_t bytes) const;

  std::vector<size_t> sizes_;
  std::vector<Timed> ways_;
};

}  // namespace hvdtorch
