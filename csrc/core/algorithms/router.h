// The one router of a data context's collectives: where each runs, for
// host and device tensors alike, and what decides it. The ops hand it facts
// (the reducer asked for, dtype, op, size, the device of their tensors) and
// take its answer; none of them picks an algorithm or a route itself.
//
// All-reduces (route()): host tensors go to a reducer, the one asked for
// or, for `auto`, the one the calibrated cost model holds cheapest (its
// ReducerSet, reducer_set.h); device tensors take a route, the backend's
// device collectives, the device ring or staging through the host to a
// host reducer, which `auto` picks by a rule until the device calibration
// has measured (its DeviceRouter, device_router.h, which runs the
// calibration). The other ops with a device path (placement()) run on the
// device where the backend's device collectives take them and are staged
// otherwise; a reduce-scatter's host reducer is reduceScatterer()'s. It also
// owns the device memory fused units of device tensors are packed into,
// for every op with a device path (deviceFusion()).
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
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/device_router.h"
#include "algorithms/reducer_set.h"
#include "transport/context.h"

namespace hvdtorch {

// What one all-reduce (a unit: its tensors fused) asks the router.
struct AllreduceQuery {
  ReducerId asked = kAutoReducer;  // a registered reducer or kAutoReducer
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;  // the reduced op (Average arrives as Sum)
  size_t bytes = 0;
  // Device tensors: `on_device`, and their one device, or null where they
  // are on several; `several_devices` then says so, which route() throws
  // where a device route would take them (staging takes any devices).
  bool on_device = false;
  Device* device = nullptr;
  std::string several_devices;
  // Device tensors: how the device calibration runs the staged route on a
  // scratch buffer through each host reducer the router hands it (staging
  // is the op's: ops/allreduce_staged.h), and what is told before (true)
  // and after (false) the calibration runs (DeviceRouter::path).
  std::function<void(Device& device, void* buf, size_t count, Reducer& host)> run_staged;
  std::function<void(bool begin)> calibrating;
};

// The router's answer: exactly one way.
struct AllreduceRoute {
  Device* device = nullptr;  // reduce on this device: on `ring`, or where null the backend's collectives
  DeviceRing* ring = nullptr;
  // One rank holding device tensors: nothing to exchange; they are scaled
  // on their device (staging would move every byte through the host twice).
  bool alone = false;
  Reducer* host = nullptr;  // otherwise this host reducer (device tensors staged through the host)
};

class Router {
 public:
  Router(Context& ctx, const ReducerEnv& env, DeviceRouterOptions options)
      : ctx_(ctx), reducers_(env), devices_(ctx, options, reducers_) {}
  // Frees the device fusion memory: device work that used it has finished
  // (the executor, which waits for it, is gone first).
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Where an all-reduce runs. Device tensors take a device route where
  // `asked` has them (ring, native, auto) and one applies
  // (DeviceRouter::path, which may calibrate first: a collective); at one
  // rank only reducer="native", asked for by name, still runs the backend's
  // device collective, and otherwise the tensors stay alone on their device.
  // Everything else runs on a host reducer: `asked`, or for `auto` the cost
  // model's choice, which may explore an under-measured reducer
  // (ReducerSet::pick). Every rank asks for the same units in the same
  // order; the answer is the same on every rank.
  AllreduceRoute route(const AllreduceQuery& query);

  // Where an op other than the all-reduce with a device path (reduce-scatter,
  // all-gather, broadcast, all-to-all) runs tensors of `device`: on it,
  // through the backend's device collectives, where they take the op (a
  // reducing op passes its reduced op and every input's dtype; more than one
  // rank); otherwise null, and the caller stages them through the host
  // (Executor::deviceOrStage). The same answer on every rank.
  Device* placement(Device& device, const std::vector<DataType>& dtypes, std::optional<ReduceOp> reduce) {
    return devices_.backendTakes(device, dtypes, reduce) ? &device : nullptr;
  }

  // The host reducer of a reduce-scatter of `bytes`: the cheapest available
  // one with a reduce-scatter on this context.
  Reducer& reduceScatterer(size_t bytes, DataType dtype, ReduceOp op) {
    return reducers_.reduceScatterer(ctx_, bytes, dtype, op);
  }

  // ---- what the routes run on ----
  // The device rings' teardown handshake (DeviceRouter::closeRings), a collective.
  void closeRings() { devices_.closeRings(); }
  // After a failure, from any thread (DeviceRouter::releaseRingWaits).
  void releaseRingWaits() { devices_.releaseRingWaits(); }
  // Device memory of at least `bytes` on `device` for one fused unit of
  // any op with a device path; valid until the next call for that device.
  // Grows by doubling; a smaller buffer is released in stream order, after
  // the work enqueued on it.
  void* deviceFusion(Device& device, size_t bytes);

  // A process set's router: its device calibration starts from the global
  // set's router's (DeviceRouter::startFrom). Before the first route().
  void startFrom(const Router& global) { devices_.startFrom(global.devices_); }

  // The host reducers and the cost model: a host route runs through
  // reducers().allreduce (timed into the model); the engine's checks and
  // calibration at init, the Python side's view of the model.
  ReducerSet& reducers() { return reducers_; }
  const ReducerSet& reducers() const { return reducers_; }

 private:
  Context& ctx_;
  ReducerSet reducers_;
  DeviceRouter devices_;
  struct DeviceBuffer {
    void* data = nullptr;
    size_t bytes = 0;
  };
  std::map<Device*, DeviceBuffer> device_fusion_;
};

}  // namespace hvdtorch
