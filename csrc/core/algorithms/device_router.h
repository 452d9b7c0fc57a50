// Where an all-reduce of device tensors goes, on one data context: the route
// `auto` takes on each device (the rule, then the device calibration's
// model, device_routes.h), the device rings it runs on, and the calibration
// itself. The device half of a data context's Router (router.h), which owns
// it beside its ReducerSet.
//
// The routes: the backend's device collectives (`native`: NCCL on CUDA),
// the device ring (`ring`, device_ring.h), or staging through the host
// (every other reducer, and wherever those two do not apply).
//
// `auto` follows a rule until the device calibration has measured: the
// device collectives where they serve (NCCL with one GPU per rank, what DDP
// runs), the device ring on one host where they do not (ranks sharing a
// GPU: each byte moves once, device to device), staging otherwise (across
// hosts the ring's links stage one segment at a time, where the staged node
// reducer reduces on the host in parallel). The calibration runs once per
// device and router, in the first `auto` all-reduce of that device where
// more than one route applies: it times each route on a scratch buffer of
// the device at three sizes (HVDTORCH_DEVICE_CALIBRATION_BYTES and 1/16 and
// 1/256 of it; float32 Sum; five interleaved repetitions after a warm-up,
// each ending with the engine stream drained), min-reduces the ranks'
// medians, and from then on `auto` takes, per op size, the route the model
// holds clearly faster than the rule's.
//
// Everything that decides is agreed: which routes apply is decided
// collectively on first use, in the same unit on every rank; the dtype, op
// and device kind are in the op's signature; the times are min-reduced.
// Only the device index is this rank's own.
//
// Thread-safety: the executor's thread only (path(), ring(), closeRings()),
// but releaseRingWaits(), from any thread.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/device_ring.h"
#include "algorithms/device_routes.h"
#include "algorithms/reducer.h"
#include "transport/context.h"

namespace hvdtorch {

struct DevicePath {
  Device* device = nullptr;    // null: stage through the host
  DeviceRing* ring = nullptr;  // the device ring on `device`; null: the backend's device collectives
};

struct DeviceRouterOptions {
  DeviceRingOptions device_ring;
  // The largest all-reduce the calibration times (HVDTORCH_DEVICE_CALIBRATION_BYTES);
  // 0: none, `auto` follows its rule. Alike on every rank.
  size_t calibration_bytes = 16u << 20;
};

class DeviceRouter {
 public:
  // The calibration's run of the staged route: one float32 Sum all-reduce
  // of buf[0 .. count), memory of `device`, staged through the host, as the
  // all-reduce op stages (the executor's pinned pool and segments: timing
  // anything else would measure another route). The router runs the two
  // device routes itself and returns once the device has finished each.
  using RunStaged = std::function<void(Device& device, void* buf, size_t count)>;

  DeviceRouter(Context& ctx, DeviceRouterOptions options) : ctx_(ctx), options_(options) {}
  DeviceRouter(const DeviceRouter&) = delete;
  DeviceRouter& operator=(const DeviceRouter&) = delete;

  // Whether reducer `asked` may keep device tensors on the device (ring,
  // native, auto); every other reducer stages them.
  static bool hasDeviceRoutes(ReducerId asked);
  // The route of an all-reduce of `bytes` of `dtype`/`op` (the reduced op)
  // on `device` for reducer `asked` (a registered reducer or kAutoReducer).
  // The first `auto` one of a device decides its routes first: the
  // calibration, a collective, runs where more than one route applies (the
  // staged one through `staged`), between calibrating(true) and
  // calibrating(false) (the op's timeline phase; may be empty).
  DevicePath path(Device& device, ReducerId asked, DataType dtype, ReduceOp op, size_t bytes, const RunStaged& staged,
                  const std::function<void(bool begin)>& calibrating = nullptr);
  // Whether the backend's device collectives take an op other than the
  // all-reduce on `device`: a reducing one (`reduce`, the reduced op) for
  // each of `dtypes`, a moving one (broadcast, all-gather, all-to-all)
  // where they move its memory; never on one rank. The same answer on every
  // rank (the device kind, dtypes and op are in the op's signature); the
  // first ask of a device may be a collective (NativeCollectives).
  bool backendTakes(Device& device, const std::vector<DataType>& dtypes, std::optional<ReduceOp> reduce) const;

  // The device ring on `device` over this router's context, made on first
  // use (a collective: every rank makes it in the same unit); null where it
  // does not apply or is turned off.
  DeviceRing* ring(Device& device);
  // The device rings' teardown handshake (DeviceRing::close), a collective:
  // every rank calls it after its last unit when the engine stops cleanly,
  // and every member of a process set when the set is removed. Errors are
  // reported on stderr; the rings are then freed without it.
  void closeRings();
  // After a failure: DeviceRing::releaseWaits on every ring made so far. Any
  // thread (the engine calls it from whichever thread saw the failure).
  void releaseRingWaits();

 private:
  struct Routes {
    bool calibrated = false;
    std::optional<DeviceRouteModel> model;  // where it measured (more than one route applied)
  };
  // Whether path() for `asked` on `device` decides `auto`'s routes first.
  bool calibratesNext(Device& device, ReducerId asked) const;
  DeviceRouteModel calibrate(Device& device, const DeviceRouteMask& routes, const RunStaged& staged);
  // One calibration run of `route` on buf[0 .. count), the engine stream
  // drained after it.
  void runRoute(DeviceRoute route, Device& device, void* buf, size_t count, const RunStaged& staged);

  Context& ctx_;
  DeviceRouterOptions options_;
  std::mutex rings_mu_;                                   // rings_ against releaseRingWaits() from another thread
  std::map<Device*, std::unique_ptr<DeviceRing>> rings_;  // null: does not apply
  std::map<Device*, Routes> routes_;
};

// The calibrations this process ran and the last one's model, described
// (DeviceRouteModel::describe); for tests and the log.
int deviceCalibrations();
std::string lastDeviceCalibration();

}  // namespace hvdtorch
