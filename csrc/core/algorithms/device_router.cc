#include "algorithms/device_router.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <vector>

#include "algorithms/reducer_registry.h"
#include "algorithms/ring_allreduce.h"

namespace hvdtorch {

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

}  // namespace

bool DeviceRouter::hasDeviceRoutes(ReducerId asked) {
  static const ReducerId ring = parseReducer("ring");
  static const ReducerId native = parseReducer("native");
  return asked == ring || asked == native || asked == kAutoReducer;
}

bool DeviceRouter::calibratesNext(Device& device, ReducerId asked) const {
  if (asked != kAutoReducer || options_.calibration_bytes == 0) return false;
  const auto it = routes_.find(&device);
  return it == routes_.end() || !it->second.calibrated;
}

DeviceRing* DeviceRouter::ring(Device& device) {
  {
    std::lock_guard<std::mutex> lk(rings_mu_);
    auto it = rings_.find(&device);
    if (it != rings_.end()) return it->second.get();
  }
  // Made outside the lock: construction is a collective with the neighbours.
  std::unique_ptr<DeviceRing> ring;
  if (options_.device_ring.enabled && DeviceRing::applicable(ctx_, device))
    ring = std::make_unique<DeviceRing>(ctx_, device, options_.device_ring);
  std::lock_guard<std::mutex> lk(rings_mu_);
  return rings_.emplace(&device, std::move(ring)).first->second.get();
}

void DeviceRouter::releaseRingWaits() {
  std::lock_guard<std::mutex> lk(rings_mu_);
  for (auto& [device, ring] : rings_)
    if (ring) ring->releaseWaits();
}

void DeviceRouter::closeRings() {
  // In device order, the same on every rank (the map's is by address).
  std::vector<std::pair<DeviceId, DeviceRing*>> rings;
  {
    std::lock_guard<std::mutex> lk(rings_mu_);
    for (auto& [device, ring] : rings_)
      if (ring) rings.emplace_back(device->id(), ring.get());
  }
  std::sort(rings.begin(), rings.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.first.kind, a.first.index) < std::make_pair(b.first.kind, b.first.index);
  });
  for (auto& [id, ring] : rings) {
    try {
      ring->close();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "hvdtorch: rank %d: closing the device ring on %s: %s\n", ctx_.rank(), id.str().c_str(),
                   e.what());
    }
  }
}

// Times every route of `routes` on `d` and agrees the times (see the header).
bool DeviceRouter::backendTakes(Device& d, const std::vector<DataType>& dtypes, std::optional<ReduceOp> reduce) const {
  NativeCollectives* backend = ctx_.native();
  if (ctx_.size() == 1 || backend == nullptr) return false;
  if (!reduce) return backend->movesOnDevice(d);
  for (DataType dtype : dtypes)
    if (!backend->reducesOnDevice(d, dtype, *reduce)) return false;
  return true;
}

void DeviceRouter::runRoute(DeviceRoute route, Device& d, void* buf, size_t count, const RunStaged& staged) {
  switch (route) {
    case DeviceRoute::kNative:
      ctx_.native()->allreduceOnDevice(d, buf, count, DataType::kFloat32, ReduceOp::kSum);
      break;
    case DeviceRoute::kRing: ring(d)->allreduce(buf, count, DataType::kFloat32, ReduceOp::kSum); break;
    case DeviceRoute::kStaged: staged(d, buf, count); break;
  }
  drainEngineStream(d);
}

DeviceRouteModel DeviceRouter::calibrate(Device& d, const DeviceRouteMask& routes, const RunStaged& staged) {
  const std::vector<size_t> sizes = probeSizes(options_.calibration_bytes);
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
        runRoute(static_cast<DeviceRoute>(r), d, scratch.p, count, staged);
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
  agree.allreduce(ctx_, stats.data(), stats.size(), DataType::kFloat64, ReduceOp::kMin);
  std::array<std::vector<double>, kDeviceRoutes> seconds;
  for (int r = 0; r < kDeviceRoutes; ++r)
    for (size_t i = 0; i < sizes.size(); ++i) seconds[r].push_back(stats[r * sizes.size() + i]);
  return DeviceRouteModel(sizes, seconds);
}

DevicePath DeviceRouter::path(Device& d, ReducerId asked, DataType dtype, ReduceOp op, size_t bytes,
                              const RunStaged& staged, const std::function<void(bool begin)>& calibrating) {
  static const ReducerId ring_id = parseReducer("ring");
  static const ReducerId native = parseReducer("native");
  NativeCollectives* backend = ctx_.native();
  if (asked == native)
    return backend && backend->reducesOnDevice(d, dtype, op) ? DevicePath{&d, nullptr} : DevicePath{};
  if (asked == ring_id) {
    DeviceRing* on = ring(d);
    return on ? DevicePath{&d, on} : DevicePath{};
  }
  if (asked != kAutoReducer) return {};

  const bool calibrate_now = calibratesNext(d, asked);
  Routes& routes = routes_[&d];
  if (calibrate_now) {
    if (calibrating) calibrating(true);
    // The routes that apply at all (float32 Sum: what every route serves).
    // Each check is a collective on first use: the same order on every rank.
    DeviceRouteMask applies{};
    applies[static_cast<int>(DeviceRoute::kNative)] = backend &&
                                                      backend->reducesOnDevice(d, DataType::kFloat32, ReduceOp::kSum);
    applies[static_cast<int>(DeviceRoute::kRing)] = ring(d) != nullptr;
    applies[static_cast<int>(DeviceRoute::kStaged)] = true;
    if (std::count(applies.begin(), applies.end(), true) > 1) {
      routes.model = calibrate(d, applies, staged);
      ++calibrations;
      const std::string described = routes.model->describe();
      {
        std::lock_guard<std::mutex> lock(last_mu);
        last_description = described;
      }
      if (ctx_.rank() == 0)
        std::fprintf(stderr, "hvdtorch: reducer=auto measured the all-reduce routes of %s (%s)\n", d.id().str().c_str(),
                     described.c_str());
    }
    routes.calibrated = true;
    if (calibrating) calibrating(false);
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
  } else if (elementwise && DeviceRing::oneHost(ctx_) && ring(d)) {
    rule = DeviceRoute::kRing;
  }
  // Where calibration ran, the ring already exists (or is known not to).
  if (routes.model) serves[static_cast<int>(DeviceRoute::kRing)] = elementwise && ring(d) != nullptr;
  const DeviceRoute route = routes.model ? routes.model->choose(bytes, serves, rule) : rule;
  switch (route) {
    case DeviceRoute::kNative: return {&d, nullptr};
    case DeviceRoute::kRing: return {&d, ring(d)};
    case DeviceRoute::kStaged: break;
  }
  return {};
}

int deviceCalibrations() { return calibrations.load(); }

std::string lastDeviceCalibration() {
  std::lock_guard<std::mutex> lock(last_mu);
  return last_description;
}

}  // namespace hvdtorch
