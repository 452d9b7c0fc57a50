// Where an all-reduce of device tensors goes, on one data context: the way
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
// more than one route applies. It times, on a scratch buffer of the
// device, each device route and the staged route once per host reducer
// `auto` may run (ReducerSet::candidates), at the sizes from 4 KiB (the
// latency-bound end) up by factors of 4 to
// HVDTORCH_DEVICE_CALIBRATION_BYTES (the fusion buffer's size by default:
// the largest unit), float32 Sum, five interleaved repetitions after a
// warm-up, each ending with the engine stream drained; it min-reduces the
// ranks' medians, and from then on `auto` takes, per op size, the way the
// model holds fastest unless the rule's route is within its margin, and
// stages through the host reducer measured fastest staged (not the host
// cost model's pick, which times the host part alone and may explore).
//
// A process set's router starts from the global set's calibration of the
// device (startFrom) where every member holds one and the set lies on one
// host exactly when the global set does (the routes that apply, and so
// their order of speed, follow from that); otherwise it calibrates on its
// own. Whether every member holds one is agreed in the set's first `auto`
// all-reduce of the device, so the members take the same model.
//
// Everything that decides is agreed: which routes apply is decided
// collectively on first use, in the same unit on every rank; the dtype, op
// and device kind are in the op's signature; the times are min-reduced.
// Only the device index is this rank's own.
//
// Thread-safety: the executor's thread only (path(), ring(), closeRings()),
// but releaseRingWaits() and calibrated(), from any thread.
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
#include "algorithms/reducer_set.h"
#include "transport/context.h"

namespace hvdtorch {

struct DevicePath {
  Device* device = nullptr;    // null: stage through the host
  DeviceRing* ring = nullptr;  // the device ring on `device`; null: the backend's device collectives
  // Staging: the host reducer the calibration measured fastest for it;
  // kAutoReducer: the host cost model's pick.
  ReducerId host = kAutoReducer;
};

struct DeviceRouterOptions {
  DeviceRingOptions device_ring;
  // The largest all-reduce the calibration times (HVDTORCH_DEVICE_CALIBRATION_BYTES);
  // 0: none, `auto` follows its rule. Alike on every rank.
  size_t calibration_bytes = 64u << 20;
};

class DeviceRouter {
 public:
  // The calibration's run of the staged route: one float32 Sum all-reduce
  // of buf[0 .. count), memory of `device`, staged through the host to
  // `host`, as the all-reduce op stages (the executor's pinned pool and
  // segments: timing anything else would measure another route). The
  // router runs the two device routes itself and returns once the device
  // has finished each.
  using RunStaged = std::function<void(Device& device, void* buf, size_t count, Reducer& host)>;

  // `reducers`: the host reducers of the same context (the Router's), which
  // staging reduces on; outlives the router.
  DeviceRouter(Context& ctx, DeviceRouterOptions options, ReducerSet& reducers)
      : ctx_(ctx), options_(options), reducers_(reducers) {}
  DeviceRouter(const DeviceRouter&) = delete;
  DeviceRouter& operator=(const DeviceRouter&) = delete;

  // Whether reducer `asked` may keep device tensors on the device (ring,
  // native, auto); every other reducer stages them.
  static bool hasDeviceRoutes(ReducerId asked);
  // The route of an all-reduce of `bytes` of `dtype`/`op` (the reduced op)
  // on `device` for reducer `asked` (a registered reducer or kAutoReducer).
  // The first `auto` one of a device decides its routes first: it adopts
  // the global set's model (startFrom) or runs the calibration, a
  // collective, where more than one route applies (the staged one through
  // `staged`), between calibrating(true) and calibrating(false) (the op's
  // timeline phase; may be empty).
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

  // A process set's router: start each device from `global`'s calibration
  // (the global set's router, which outlives this one) where the header's
  // conditions hold. Before the first path().
  void startFrom(const DeviceRouter& global) { global_ = &global; }
  // The model this router measured or adopted for `device`, if any; any thread.
  std::optional<DeviceRouteModel> calibrated(const Device& device) const;

 private:
  struct Routes {
    bool calibrated = false;
    std::optional<DeviceRouteModel> model;  // where it measured (more than one route applied)
  };
  // Whether path() for `asked` on `device` decides `auto`'s routes first.
  bool calibratesNext(Device& device, ReducerId asked) const;
  // The global set's model of `device`, where every member of this set
  // holds one (a collective on this router's context); otherwise none.
  std::optional<DeviceRouteModel> adoptGlobal(Device& device);
  DeviceRouteModel calibrate(Device& device, const std::vector<DeviceWay>& ways, const RunStaged& staged);
  // One calibration run of `way` on buf[0 .. count), the engine stream
  // drained after it.
  void runWay(const DeviceWay& way, Device& device, void* buf, size_t count, const RunStaged& staged);

  Context& ctx_;
  DeviceRouterOptions options_;
  ReducerSet& reducers_;
  const DeviceRouter* global_ = nullptr;                  // a process set's: the global set's router
  std::mutex rings_mu_;                                   // rings_ against releaseRingWaits() from another thread
  std::map<Device*, std::unique_ptr<DeviceRing>> rings_;  // null: does not apply
  std::map<Device*, Routes> routes_;
  mutable std::mutex models_mu_;                      // models_ against calibrated() from another thread
  std::map<const Device*, DeviceRouteModel> models_;  // routes_[d].model, readable from any thread
};

// The calibrations this process ran and the last one's model, described
// (DeviceRouteModel::describe); for tests and the log. A model adopted from
// the global set counts in deviceCalibrationsAdopted() instead.
int deviceCalibrations();
int deviceCalibrationsAdopted();
std::string lastDeviceCalibration();

}  // namespace hvdtorch
