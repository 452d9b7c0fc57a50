// The CUDA implementation of Device (cuda_device.cu, built by nvcc when the
// CUDA toolkit is found). This header names no CUDA type, so torch-free and
// CUDA-free code can ask for a GPU device; the definition exists only in
// builds that compiled the .cu files (HVDTORCH_HAVE_CUDA_DEVICE).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "device/device.h"

namespace hvdtorch {

// The device with this CUDA ordinal. Its engine stream is a non-blocking
// stream created here. Throws CollectiveError when CUDA has no such device
// (the message carries CUDA's own error string).
std::unique_ptr<Device> makeCudaDevice(int ordinal);

// The cudaStream_t of a CUDA device's engine stream (as void*: this header
// names no CUDA type), for the framework to allocate on it.
void* cudaEngineStream(Device& device);

// Number of visible CUDA devices; 0 (and `why` says why) where CUDA cannot
// run: no driver, no device, CUDA_VISIBLE_DEVICES empty.
int cudaDeviceCount(std::string* why);

// The GPU's UUID (16 bytes): equal on two ranks exactly when they use one
// GPU, whatever their ordinals. Throws CollectiveError naming the device.
std::array<uint8_t, 16> cudaDeviceUuid(int ordinal);

}  // namespace hvdtorch
