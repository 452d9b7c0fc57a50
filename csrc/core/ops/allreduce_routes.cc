#include "ops/allreduce_routes.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <mutex>

#include "algorithms/reducer_registry.h"
#include "algorithms/ring_allreduce.h"
#include "engine/execution/host_staging.h"
#include "ops/allreduce_staged.h"

namespace hvdtorch::ops {

namespace {

constexpr int kCalibrationReps = 5;

std::atomic<int> calibrations{0};
std::mutex last_mu;
std::string last_description;

// The probe sizes for a largest one: 1/256, 1/16 and all of it, whole
// float32 elements, at least one element each, without repeats.
std::vector<size_t> probeSizes(size_t largest) {
  std::vector<size_t> sizes;
  for (size_t div : {size_t(256), size_t(16), size_t(1)}) {
    const size_t bytes = std::max<size_t>(sizeof(float), largest / div / sizeof(float) * sizeof(float));
    if (sizes.empty() || bytes > sizes.back()) sizes.push_back(bytes);
  }
  return sizes;
}

// One float32 Sum all-reduce of buf[0 .. count) by `route`; returns once
// the device has finished it (the engine stream drained).
void runRoute(Executor& ex, Device& d, DeviceRoute route, void* buf, size_t count) {
  switch (route) {
    case DeviceRoute::kNative:
      ex.ctx().native()->allreduceOnDevice(d, buf, count, DataType::kFloat32, ReduceOp::kSum);
      break;
    case DeviceRoute::kRing: ex.deviceRing(d)->allreduce(buf, count, DataType::kFloat32, ReduceOp::kSum); break;
    case DeviceRoute::kStaged: {
      const size_t bytes = count * sizeof(float);
      Reducer& host = ex.reducers().resolve(kAutoReducer, ex.ctx(), bytes, DataType::kFloat32, ReduceOp::kSum);
      reduceStaged(ex, {{&d, buf, buf, 0, count}}, host, DataType::kFloat32, count, ReduceOp::kSum, {},
                   [](const std::string&, bool) {});
      break;
    }
  }
  d.synchronize(*drainEngineStream(d));
}

// Times every route of `routes` on `d` and agrees the times (see the header).
DeviceRouteModel calibrate(Executor& ex, Device& d, const DeviceRouteMask& routes) {
  const std::vector<size_t> sizes = probeSizes(ex.options().device_calibration_bytes);
  struct Scratch {
    Device& d;
    void* p;
    ~Scratch() { d.release(p); }
  } scratch{d, d.allocate(sizes.back())};
  d.fill(scratch.p, sizes.back(), 0, nullptr);
  // stats[route * sizes + i]: this rank's median, -1 for a route not run.
  std::vector<double> stats(kDeviceRoutes * sizes.size(), -1.0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t count = sizes[i] / sizeof(float);
    std::array<std::vector<double>, kDeviceRoutes> times;
    // Interleaved, so a burst of load hits every route alike; rep -1 warms
    // up (first-use allocations, registrations, links).
    for (int rep = -1; rep < kCalibrationReps; ++rep) {
      for (int r = 0; r < kDeviceRoutes; ++r) {
        if (!routes[r]) continue;
        const auto t0 = std::chrono::steady_clock::now();
        runRoute(ex, d, static_cast<DeviceRoute>(r), scratch.p, count);
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
        if (rep >= 0) times[r].push_back(took.count());
      }
    }
    for (int r = 0; r < kDeviceRoutes; ++r) {
      if (!routes[r]) continue;
      auto& t = times[r];
      const auto middle = t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2);
      std::nth_element(t.begin(), middle, t.end());
      stats[r * sizes.size() + i] = t[t.size() / 2];
    }
  }
  // Min over ranks, as the host cost model agrees (reducer_set.cc); the
  // routes not run are -1 on every rank. A fixed reducer: the model must
  // not choose how it is agreed.
  RingAllreduce agree;
  agree.allreduce(ex.ctx(), stats.data(), stats.size(), DataType::kFloat64, ReduceOp::kMin);
  std::array<std::vector<double>, kDeviceRoutes> seconds;
  for (int r = 0; r < kDeviceRoutes; ++r)
    for (size_t i = 0; i < sizes.size(); ++i) seconds[r].push_back(stats[r * sizes.size() + i]);
  return DeviceRouteModel(sizes, seconds);
}

}  // namespace

bool hasDeviceRoutes(ReducerId asked) {
  static const ReducerId ring = parseReducer("ring");
  static const ReducerId native = parseReducer("native");
  return asked == ring || asked == native || asked == kAutoReducer;
}

bool calibratesNext(Executor& ex, Device& d, ReducerId asked) {
  return asked == kAutoReducer && !ex.deviceRoutes(d).calibrated && ex.options().device_calibration_bytes > 0;
}

DevicePath devicePath(Executor& ex, Device& d, ReducerId asked, DataType dtype, ReduceOp op, size_t bytes) {
  static const ReducerId ring = parseReducer("ring");
  static const ReducerId native = parseReducer("native");
  NativeCollectives* backend = ex.ctx().native();
  if (asked == native) return backend && backend->reducesOnDevice(d, dtype, op) ? DevicePath{&d, false} : DevicePath{};
  if (asked == ring) return ex.deviceRing(d) ? DevicePath{&d, true} : DevicePath{};
  if (asked != kAutoReducer) return {};

  Executor::DeviceRoutes& routes = ex.deviceRoutes(d);
  if (calibratesNext(ex, d, asked)) {
    // The routes that apply at all (float32 Sum: what every route serves).
    // Each check is a collective on first use: the same order on every rank.
    DeviceRouteMask applies{};
    applies[static_cast<int>(DeviceRoute::kNative)] = backend &&
                                                      backend->reducesOnDevice(d, DataType::kFloat32, ReduceOp::kSum);
    applies[static_cast<int>(DeviceRoute::kRing)] = ex.deviceRing(d) != nullptr;
    applies[static_cast<int>(DeviceRoute::kStaged)] = true;
    if (std::count(applies.begin(), applies.end(), true) > 1) {
      routes.model = calibrate(ex, d, applies);
      ++calibrations;
      const std::string described = routes.model->describe();
      {
        std::lock_guard<std::mutex> lock(last_mu);
        last_description = described;
      }
      if (ex.ctx().rank() == 0)
        std::fprintf(stderr, "hvdtorch: reducer=auto measured the all-reduce routes of %s (%s)\n", d.id().str().c_str(),
                     described.c_str());
    }
    routes.calibrated = true;
  }

  // The device ring combines segments element by element (Device::reduceInto);
  // Adasum's coefficients need whole vectors, so it is staged, where the
  // host reducer that owns the op sees each tensor whole. `op` is the same
  // on every rank, so every rank skips the ring's first-use check alike.
  const bool elementwise = op != ReduceOp::kAdasum;
  DeviceRouteMask serves{};
  serves[static_cast<int>(DeviceRoute::kNative)] = backend && backend->reducesOnDevice(d, dtype, op);
  serves[static_cast<int>(DeviceRoute::kStaged)] = true;
  DeviceRoute rule = DeviceRoute::kStaged;
  if (serves[static_cast<int>(DeviceRoute::kNative)]) {
    rule = DeviceRoute::kNative;
  } else if (elementwise && DeviceRing::oneHost(ex.ctx()) && ex.deviceRing(d)) {
    rule = DeviceRoute::kRing;
  }
  // Where calibration ran, the ring already exists (or is known not to).
  if (routes.model) serves[static_cast<int>(DeviceRoute::kRing)] = elementwise && ex.deviceRing(d) != nullptr;
  const DeviceRoute route = routes.model ? routes.model->choose(bytes, serves, rule) : rule;
  switch (route) {
    case DeviceRoute::kNative: return {&d, false};
    case DeviceRoute::kRing: return {&d, true};
    case DeviceRoute::kStaged: break;
  }
  return {};
}

int deviceCalibrations() { return calibrations.load(); }

std::string lastDeviceCalibration() {
  std::lock_guard<std::mutex> lock(last_mu);
  return last_description;
}

}  // namespace hvdtorch::ops
