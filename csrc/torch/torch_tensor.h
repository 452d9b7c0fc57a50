// at::Tensor <-> the core's TensorBuffer, at::ScalarType <-> DataType, and
// the wire codec's rule for torch dtypes.
#pragma once

#include <ATen/core/Tensor.h>

#include "common/dtype.h"
#include "engine/tensor.h"
#include "gradients/wire_codec.h"

namespace hvdtorch {

// Throws InvalidArgument naming the op and tensor for dtypes the core lacks.
DataType toDataType(at::ScalarType t, const std::string& where);
at::ScalarType toScalarType(DataType t);
// The dtype a tensor of `dtype` travels in under `codec` (wireDtype() for torch dtypes); a dtype hvdtorch
// does not carry (complex, say) travels as it is.
at::ScalarType wireScalarType(WireCodec codec, at::ScalarType dtype);

// Keeps the tensor alive for as long as the engine holds the buffer. The
// tensor must be contiguous (the Python layer makes sure of it); `device`
// and `ready` as tensor_binding.h makes them.
class TorchTensor : public TensorBuffer {
 public:
  TorchTensor(at::Tensor t, DataType dtype, DeviceId device = {}, std::shared_ptr<Event> ready = nullptr)
      : tensor_(std::move(t)), dtype_(dtype), device_(device), ready_(std::move(ready)) {}
  DeviceId device() const override { return device_; }
  std::shared_ptr<Event> ready() const override { return ready_; }
  void* data() override { return tensor_.data_ptr(); }
  DataType dtype() const override { return dtype_; }
  std::vector<int64_t> shape() const override { return tensor_.sizes().vec(); }
  int64_t numel() const override { return tensor_.numel(); }
  const at::Tensor& tensor() const { return tensor_; }

 private:
  at::Tensor tensor_;
  DataType dtype_;
  DeviceId device_;
  std::shared_ptr<Event> ready_;
};

}  // namespace hvdtorch
