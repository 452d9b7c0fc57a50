// Which route an all-reduce of device tensors takes: the backend's device
// collectives (`native`: NCCL on CUDA), the device ring (`ring`,
// algorithms/device_ring.h), or staging through the host (every other
// reducer, and wherever those two do not apply).
//
// `auto` follows a rule until the device calibration has measured: the
// device collectives where they serve (NCCL with one GPU per rank, what DDP
// runs), the device ring on one host where they do not (ranks sharing a
// GPU: each byte moves once, device to device), staging otherwise (across
// hosts the ring's links stage one segment at a time, where the staged node
// reducer reduces on the host in parallel). The calibration runs once per
// device and executor, in the first `auto` all-reduce of that device where
// more than one route applies: it times each route on a scratch buffer of
// the device at three sizes (HVDTORCH_DEVICE_CALIBRATION_BYTES and 1/16 and
// 1/256 of it; float32 Sum; five interleaved repetitions after a warm-up,
// each ending with the engine stream drained), min-reduces the ranks'
// medians, and from then on `auto` takes, per op size, the route the model
// (algorithms/device_routes.h) holds clearly faster than the rule's.
//
// Everything that decides is agreed: which routes apply is decided
// collectively on first use, in the same unit on every rank; the dtype, op
// and device kind are in the op's signature; the times are min-reduced.
// Only the device index is this rank's own.
#pragma once

#include "algorithms/device_routes.h"
#include "algorithms/reducer.h"
#include "engine/execution/executor.h"

namespace hvdtorch::ops {

struct DevicePath {
  Device* device = nullptr;  // null: stage through the host
  bool ring = false;         // the device ring; else the backend's device collectives
};

// Whether reducer `asked` may keep device tensors on the device (ring,
// native, auto); every other reducer stages them.
bool hasDeviceRoutes(ReducerId asked);

// Whether devicePath() for `asked` on `device` decides `auto`'s routes
// first (the calibration, where more than one route applies).
bool calibratesNext(Executor& ex, Device& device, ReducerId asked);

// The route of an all-reduce of `bytes` of `dtype`/`op` (the reduced op)
// on `device` for reducer `asked` (a registered reducer or kAutoReducer).
// May run the calibration (a collective). On the executor thread.
DevicePath devicePath(Executor& ex, Device& device, ReducerId asked, DataType dtype, ReduceOp op, size_t bytes);

// The calibrations this process ran and the last one's model, described
// (DeviceRouteModel::describe); for tests and the log.
int deviceCalibrations();
std::string lastDeviceCalibration();

}  // namespace hvdtorch::ops
