// The devices of this process: one Device per DeviceId, made on first use
// and kept until the process exits, so that every part of the engine that
// meets a buffer of "cuda:1" talks to the same object (and its engine
// stream).
//
// The CPU and simulated devices are made here. The CUDA device lives in a
// library core does not link (hvdtorch_core_cuda, built by nvcc), so whoever
// links it installs its maker with setDeviceMaker(kCuda, ...) before the
// first CUDA buffer reaches the engine (the torch extension does so when it
// loads). Asking for a kind without a maker is an InvalidArgument naming the
// device and saying the build lacks it.
#pragma once

#include <functional>
#include <memory>

#include "device/device.h"

namespace hvdtorch {

using DeviceMaker = std::function<std::unique_ptr<Device>(int index)>;

// Installs (or, with nullptr, removes) the maker for `kind`; devices of that
// kind already made stay. Not for kCpu.
void setDeviceMaker(DeviceKind kind, DeviceMaker maker);

// Whether devices of `kind` can be made in this process.
bool deviceKindAvailable(DeviceKind kind);

// The device `id` names; thread-safe. Simulated devices take their options
// from the environment (SimOptions::fromEnv) with `id.index` as theirs.
Device& deviceFor(DeviceId id);

}  // namespace hvdtorch
