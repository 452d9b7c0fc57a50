// How at::Tensors become the engine's buffers for one op, and how the op's
// results come back to the framework's streams:
//  * CPU tensors are wrapped as they are (TorchTensor).
//  * CUDA tensors are wrapped as they are, on "cuda:<index>", with one ready
//    event per op recorded on the device's current CUDA stream at submit:
//    the engine's stream waits on it, the host never does. After the op,
//    the current stream waits on the op's completion event, and outputs the
//    engine allocated are recorded on that stream for the caching allocator
//    (they were made on the engine stream, which writes them first). Inputs
//    need no recordStream: the engine holds every tensor of an op until the
//    device work that uses it has run (a staged op drains the engine stream
//    before it completes, engine/execution/host_staging.h; a device-native one is held
//    until its completion event, Executor::holdUntil).
//  * HVDTORCH_SIM_DEVICE=1 (tests): CPU tensors are copied to the simulated
//    device "sim:0" on a stream standing for the caller's current stream
//    (one per thread), with a ready event, and copied back into the CPU
//    tensor on that stream after waiting on the completion event, so the
//    Python tests run every device path of the engine on a CPU.
// Refusals name the op and tensor: sparse or non-contiguous tensors, dtypes
// the core lacks, a CUDA tensor in a build without the CUDA device.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/op_state.h"
#include "engine/tensor.h"

namespace hvdtorch {

// Whether HVDTORCH_SIM_DEVICE=1 was set when the extension loaded.
bool simDeviceMode();

class OpBinding {
 public:
  explicit OpBinding(std::string where) : where_(std::move(where)) {}
  // The refusals of bind() (InvalidArgument prefixed by `where`), binding
  // nothing; returns the tensor's dtype in the core's terms.
  static DataType check(const at::Tensor& t, const std::string& where);
  // An input or a caller-given output; a tensor bound twice (in place) is
  // one buffer.
  TensorPtr bind(const at::Tensor& t);
  std::vector<TensorPtr> bindAll(const std::vector<at::Tensor>& ts);
  // Outputs the engine makes once their shape is negotiated, on t's device.
  OutputAllocator allocatorLike(const at::Tensor& t);

 private:
  // The op's ready event on a CUDA device, recorded on its current stream
  // the first time a tensor of the op is bound.
  std::shared_ptr<Event> readyEvent(DeviceId device);
  std::string where_;
  std::shared_ptr<Event> ready_;
  std::vector<std::pair<const void*, TensorPtr>> bound_;  // host data_ptr -> buffer (sim mode)
};

// Once `state` is done without error: orders the caller's current stream
// after the op (above), copies simulated outputs back, and returns the
// outputs as at::Tensors.
std::vector<at::Tensor> collectOutputs(const OpState& state);

// The at::Tensor a bound buffer stands for.
const at::Tensor& boundTensor(const TensorBuffer& buffer);

// Installs the CUDA device maker (devices.h) where the build has it.
void installDeviceMakers();

}  // namespace hvdtorch
