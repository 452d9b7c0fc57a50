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
// The calibration's smallest probe: below it every route is latency-bound
// (a bias, a norm's weight), where the model holds its time.
constexpr size_t kSmallestProbe = 4096;
constexpr size_t kProbeStep = 4;

std::atomic<int> calibrations{0};
std::atomic<int> adoptions{0};
std::mutex last_mu;
std::string last_description;

// The probe sizes up to `largest`: kSmallestProbe and kProbeStep times each
// before, then `largest` itself; whole float32 elements, at least one.
std::vector<size_t> probeSizes(size_t largest) {
  largest = std::max<size_t>(sizeof(float), largest / sizeof(float) * sizeof(float));
  std::vector<size_t> sizes;
  for (size_t bytes = kSmallestProbe; bytes < largest; bytes *= kProbeStep) sizes.push_back(bytes);
  sizes.push_back(largest);
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

bool DeviceRouter::backendTakes(Device& d, const std::vector<DataType>& dtypes, std::optional<ReduceOp> reduce) const {
  NativeCollectives* backend = ctx_.native();
  if (ctx_.size() == 1 || backend == nullptr) return false;
  if (!reduce) return backend->movesOnDevice(d);
  for (DataType dtype : dtypes)
    if (!backend->reducesOnDevice(d, dtype, *reduce)) return false;
  return true;
}

void DeviceRouter::runWay(const DeviceWay& way, Device& d, void* buf, size_t count, const RunStaged& staged) {
  switch (way.route) {
    case DeviceRoute::kNative:
      ctx_.native()->allreduceOnDevice(d, buf, count, DataType::kFloat32, ReduceOp::kSum);
      break;
    case DeviceRoute::kRing: ring(d)->allreduce(buf, count, DataType::kFloat32, ReduceOp::kSum); break;
    case DeviceRoute::kStaged: staged(d, buf, count, reducers_.get(way.host)); break;
  }
  drainEngineStream(d);
}

// Times every way of `ways` on `d` and agrees the times (see the header).
DeviceRouteModel DeviceRouter::calibrate(Device& d, const std::vector<DeviceWay>& ways, const RunStaged& staged) {
  const std::vector<size_t> sizes = probeSizes(options_.calibration_bytes);
  struct Scratch {
    Device& d;
    void* p;
    ~Scratch() { d.release(p); }
  } scratch{d, d.allocate(sizes.back())};
  d.fill(scratch.p, sizes.back(), 0, nullptr);
  // stats[w * sizes + i]: this rank's median of way w at size i.
  std::vector<double> stats(ways.size() * sizes.size(), -1.0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t count = sizes[i] / sizeof(float);
    std::vector<std::vector<double>> times(ways.size());
    // Interleaved, so a burst of load hits every way alike; rep -1 warms
    // up (first-use allocations, registrations, links).
    for (int rep = -1; rep < kCalibrationReps; ++rep) {
      for (size_t w = 0; w < ways.size(); ++w) {
        const auto t0 = std::chrono::steady_clock::now();
        runWay(ways[w], d, scratch.p, count, staged);
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
        if (rep >= 0) times[w].push_back(took.count());
      }
    }
    for (size_t w = 0; w < ways.size(); ++w) {
      auto& t = times[w];
      const auto middle = t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2);
      std::nth_element(t.begin(), middle, t.end());
      stats[w * sizes.size() + i] = t[t.size() / 2];
    }
  }
  // Min over ranks, as the host cost model agrees (reducer_set.cc). A fixed
  // reducer: the model must not choose how it is agreed.
  RingAllreduce agree;
  agree.allreduce(ctx_, stats.data(), stats.size(), DataType::kFloat64, ReduceOp::kMin);
  std::vector<DeviceRouteModel::Timed> timed;
  timed.reserve(ways.size());
  for (size_t w = 0; w < ways.size(); ++w)
    timed.push_back(
        {ways[w], std::vector<double>(stats.begin() + static_cast<std::ptrdiff_t>(w * sizes.size()),
                                      stats.begin() + static_cast<std::ptrdiff_t>((w + 1) * sizes.size()))});
  return DeviceRouteModel(sizes, std::move(timed));
}

std::optional<DeviceRouteModel> DeviceRouter::calibrated(const Device& d) const {
  std::lock_guard<std::mutex> lock(models_mu_);
  const auto it = models_.find(&d);
  if (it == models_.end()) return std::nullopt;
  return it->second;
}

std::optional<DeviceRouteModel> DeviceRouter::adoptGlobal(Device& d) {
  if (global_ == nullptr) return std::nullopt;
  std::optional<DeviceRouteModel> model;
  if (DeviceRing::oneHost(ctx_) == DeviceRing::oneHost(global_->ctx_)) model = global_->calibrated(d);
  // Every member must take the same model: adopt only where all hold it.
  // The global models are alike on every rank (agreed there), so holding
  // one is all that needs agreeing.
  int32_t held = model ? 1 : 0;
  RingAllreduce agree;
  agree.allreduce(ctx_, &held, 1, DataType::kInt32, ReduceOp::kMin);
  if (held == 0) return std::nullopt;
  return model;
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
    const bool native_applies = backend && backend->reducesOnDevice(d, DataType::kFloat32, ReduceOp::kSum);
    const bool ring_applies = ring(d) != nullptr;
    if (native_applies || ring_applies) {
      routes.model = adoptGlobal(d);
      if (routes.model) {
        ++adoptions;
      } else {
        std::vector<DeviceWay> ways;
        if (native_applies) ways.push_back({DeviceRoute::kNative, kAutoReducer});
        if (ring_applies) ways.push_back({DeviceRoute::kRing, kAutoReducer});
        const std::vector<bool> hosts = reducers_.candidates(ctx_, DataType::kFloat32, ReduceOp::kSum);
        for (size_t h = 0; h < hosts.size(); ++h)
          if (hosts[h]) ways.push_back({DeviceRoute::kStaged, static_cast<ReducerId>(h)});
        const auto t0 = std::chrono::steady_clock::now();
        routes.model = calibrate(d, ways, staged);
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
        ++calibrations;
        const std::string described = routes.model->describe();
        {
          std::lock_guard<std::mutex> lock(last_mu);
          last_description = described;
        }
        if (ctx_.rank() == 0)
          std::fprintf(stderr, "hvdtorch: reducer=auto measured the all-reduce routes of %s in %.2f s (%s)\n",
                       d.id().str().c_str(), took.count(), described.c_str());
      }
      std::lock_guard<std::mutex> lock(models_mu_);
      models_.insert_or_assign(&d, *routes.model);
    }
    routes.calibrated = true;
    if (calibrating) calibrating(false);
  }

  // The device ring combines segments element by element (Device::reduceInto);
  // Adasum's coefficients need whole vectors, so it is staged, where the
  // host reducer that owns the op sees each tensor whole. `op` is the same
  // on every rank, so every rank skips the ring's first-use check alike.
  // (The model would not move Adasum either: its rule is staging, and no
  // staged way it measured serves Adasum, so it has nothing to compare.)
  const bool elementwise = op != ReduceOp::kAdasum;
  const bool native_serves = backend && backend->reducesOnDevice(d, dtype, op);
  DeviceRoute rule = DeviceRoute::kStaged;
  if (native_serves) {
    rule = DeviceRoute::kNative;
  } else if (elementwise && DeviceRing::oneHost(ctx_) && ring(d)) {
    rule = DeviceRoute::kRing;
  }
  DeviceWay way{rule, kAutoReducer};
  if (routes.model) {
    // Where calibration ran, the ring already exists (or is known not to).
    const bool ring_serves = elementwise && ring(d) != nullptr;
    const std::vector<bool> hosts = reducers_.candidates(ctx_, dtype, op);
    way = routes.model->choose(
        bytes,
        [&](const DeviceWay& w) {
          switch (w.route) {
            case DeviceRoute::kNative: return native_serves;
            case DeviceRoute::kRing: return ring_serves;
            case DeviceRoute::kStaged: return w.host < hosts.size() && hosts[w.host];
          }
          return false;
        },
        rule);
  }
  switch (way.route) {
    case DeviceRoute::kNative: return {&d, nullptr};
    case DeviceRoute::kRing: return {&d, ring(d)};
    case DeviceRoute::kStaged: break;
  }
  return {nullptr, nullptr, way.host};
}

int deviceCalibrations() { return calibrations.load(); }
int deviceCalibrationsAdopted() { return adoptions.load(); }

std::string lastDeviceCalibration() {
  std::lock_guard<std::mutex> lock(last_mu);
  return last_description;
}

}  // namespace hvdtorch
