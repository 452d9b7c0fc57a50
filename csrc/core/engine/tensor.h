// How the engine sees a framework tensor: a contiguous buffer with a dtype,
// shape and device, kept alive by whoever implements it (csrc/torch wraps
// at::Tensor). The engine never allocates framework memory itself; when an
// output's size is known only after negotiation (allgather, alltoall,
// reducescatter), it asks the entry's allocator.
//
// Device contract: data() is memory of device() (devices.h gives the Device
// for it); the host reads it only when device() is the CPU. When ready() is
// set, the framework recorded it on the stream that wrote the tensor (its
// current stream at submit): the engine's stream waits on it before reading
// or writing the buffer, so the host never blocks at submit. One event may
// serve every tensor of an op.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/dtype.h"
#include "device/device.h"

namespace hvdtorch {

class TensorBuffer {
 public:
  virtual ~TensorBuffer() = default;
  virtual DeviceId device() const { return DeviceId{}; }
  virtual std::shared_ptr<Event> ready() const { return nullptr; }
  virtual void* data() = 0;
  virtual DataType dtype() const = 0;
  virtual std::vector<int64_t> shape() const = 0;
  virtual int64_t numel() const = 0;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtypeSize(dtype()); }
};

using TensorPtr = std::shared_ptr<TensorBuffer>;
using OutputAllocator = std::function<TensorPtr(DataType dtype, const std::vector<int64_t>& shape)>;

// Plain heap memory, for the C++ tests and for internal scratch.
class HostTensor : public TensorBuffer {
 public:
  HostTensor(DataType dtype, std::vector<int64_t> shape);
  void* data() override { return storage_.data(); }
  DataType dtype() const override { return dtype_; }
  std::vector<int64_t> shape() const override { return shape_; }
  int64_t numel() const override { return numel_; }

 private:
  DataType dtype_;
  std::vector<int64_t> shape_;
  int64_t numel_;
  std::vector<char> storage_;
};

}  // namespace hvdtorch
