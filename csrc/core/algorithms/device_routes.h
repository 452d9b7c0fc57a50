// Which route `auto` gives an all-reduce of device tensors, from times
// measured on this job's devices (the device calibration, run by
// DeviceRouter, device_router.h), identical on every rank.
//
// The routes: the backend's device collectives (NCCL on CUDA), the device
// ring (device_ring.h), and staging through pinned host memory to a host
// reducer. Which apply is decided collectively, so it is alike on every
// rank; so is the rule's route, the one `auto` takes where nothing was
// measured (the device collectives where they serve, the device ring on
// one host where they do not, staging otherwise).
//
// The model holds, per route and probe size, the agreed seconds of one
// all-reduce (each rank's median of its repetitions, min-reduced over
// ranks as the host cost model does: the rank that arrived last timed the
// collective without waiting). estimate() interpolates linearly between
// probe sizes, holds the smallest probe's time below it (latency-bound)
// and scales the largest probe's time by size above it (bandwidth-bound).
// choose() keeps the rule's route unless another is faster by kSwitchMargin
// and by kMinGainSeconds: routes within measurement noise of each other do
// not swap places from run to run, and a measured large win still counts.
//
// Pure and deterministic: every rank that folds the same agreed times
// chooses the same route for the same op.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace hvdtorch {

enum class DeviceRoute : int { kNative = 0, kRing = 1, kStaged = 2 };
constexpr int kDeviceRoutes = 3;
const char* deviceRouteName(DeviceRoute route);

using DeviceRouteMask = std::array<bool, kDeviceRoutes>;  // indexed by DeviceRoute

class DeviceRouteModel {
 public:
  static constexpr double kSwitchMargin = 0.20;
  static constexpr double kMinGainSeconds = 50e-6;

  // `sizes` ascending (bytes); `seconds[route]` one agreed time per size,
  // < 0 where the route was not measured (it is then never chosen).
  DeviceRouteModel(std::vector<size_t> sizes, std::array<std::vector<double>, kDeviceRoutes> seconds);

  // Estimated seconds of `route` for `bytes`; < 0 where not measured.
  double estimate(DeviceRoute route, size_t bytes) const;
  // The route for `bytes` among `serves` (those that apply and serve this
  // op's dtype and reduction): `rule` (which must be among them) unless a
  // measured route beats its estimate by the margin and the minimum gain.
  DeviceRoute choose(size_t bytes, const DeviceRouteMask& serves, DeviceRoute rule) const;

  const std::vector<size_t>& sizes() const { return sizes_; }
  // One line for the log: each measured route's milliseconds per probe size.
  std::string describe() const;

 private:
  std::vector<size_t> sizes_;
  std::array<std::vector<double>, kDeviceRoutes> seconds_;
};

}  // namespace hvdtorch
