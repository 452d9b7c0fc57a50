// The one router of a data context's all-reduces: where each runs, for host
// and device tensors alike, and what decides it. The all-reduce op asks it
// (ops/allreduce.cc): host tensors go to a reducer, the one asked for or,
// for `auto`, the one the calibrated cost model holds cheapest (its
// ReducerSet, reducer_set.h); device tensors take a route, the backend's
// device collectives, the device ring or staging through the host to a
// host reducer, which `auto` picks by a rule until the device calibration
// has measured (its DeviceRouter, device_router.h). It also owns the device
// memory fused units of device tensors are packed into, for every op with
// a device path.
//
// One per data context (the Engine's, each process set's), made beside the
// executor that runs on that context and outliving it; the executor hands
// it to the ops' execute functions (Executor::router()).
//
// Everything that decides is agreed across ranks (see the two parts'
// headers); every rank asks in the same units, in the same order.
// Thread-safety: the executor's thread routes, runs and allocates; the
// const methods of reducers() (choose, model) may be called from any thread.
#pragma once

#include <cstddef>

#include "algorithms/device_router.h"
#include "algorithms/reducer_set.h"
#include "transport/context.h"

namespace hvdtorch {

class Router {
 public:
  Router(Context& ctx, const ReducerEnv& env, DeviceRouterOptions options)
      : ctx_(ctx), reducers_(env), devices_(ctx, options) {}
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // ---- device tensors ----
  // Whether reducer `asked` may keep device tensors on the device (ring,
  // native, auto); every other reducer stages them.
  static bool hasDeviceRoutes(ReducerId asked) { return DeviceRouter::hasDeviceRoutes(asked); }
  // Whether devicePath() for `asked` on `device` calibrates first.
  bool calibratesNext(Device& device, ReducerId asked) const { return devices_.calibratesNext(device, asked); }
  // The route of an all-reduce of `bytes` of `dtype`/`op` (the reduced op)
  // on `device` for reducer `asked`; a null device: stage through the host
  // (then hostReducer()). May run the calibration through `run` (a collective).
  DevicePath devicePath(Device& device, ReducerId asked, DataType dtype, ReduceOp op, size_t bytes,
                        const DeviceRouter::RunRoute& run) {
    return devices_.path(device, asked, dtype, op, bytes, run);
  }
  // The device ring on `device`, made on first use (a collective); null
  // where it does not apply.
  DeviceRing* ring(Device& device) { return devices_.ring(device); }
  // The device rings' teardown handshake (DeviceRouter::closeRings), a collective.
  void closeRings() { devices_.closeRings(); }
  // Device memory of at least `bytes` on `device` for one fused unit (valid
  // until the next call for that device; grows, and is freed with the
  // router, which the executor's in-flight device work never outlives).
  void* deviceFusion(Device& device, size_t bytes) { return devices_.fusionBuffer(device, bytes); }

  // ---- host tensors (and staged device tensors) ----
  // The reducer of an all-reduce of `bytes` about to run through
  // allreduce(): `asked`, or for `auto` the cost model's choice, which may
  // explore an under-measured reducer (ReducerSet::pick). Every rank asks
  // for the same ops in the same order.
  Reducer& hostReducer(ReducerId asked, size_t bytes, DataType dtype, ReduceOp op) {
    return reducers_.pick(asked, ctx_, bytes, dtype, op);
  }
  // reducer.allreduce on this context, timed into the cost model (a
  // collective; ReducerSet::allreduce).
  void allreduce(Reducer& reducer, void* data, size_t count, DataType dtype, ReduceOp op) {
    reducers_.allreduce(ctx_, reducer, data, count, dtype, op);
  }
  // The host reducers and the cost model: checks, calibration at init,
  // reduce-scatter, the Python side's view of the model.
  ReducerSet& reducers() { return reducers_; }
  const ReducerSet& reducers() const { return reducers_; }

 private:
  Context& ctx_;
  ReducerSet reducers_;
  DeviceRouter devices_;
};

}  // namespace hvdtorch
