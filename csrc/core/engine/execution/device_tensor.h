// A tensor in device memory that the engine owns: the zeros a joined rank
// contributes in place of its peers' device tensors, and the buffers the
// C++ tests run ops on. Made zero-filled on the device's engine stream
// (ordered before anything the engine enqueues on it later); released when
// the last reference goes.
#pragma once

#include <memory>
#include <vector>

#include "device/device.h"
#include "engine/tensor.h"

namespace hvdtorch {

class DeviceTensor : public TensorBuffer {
 public:
  // `zeroed` false: the caller writes every byte itself (on its own stream).
  DeviceTensor(Device& device, DataType dtype, std::vector<int64_t> shape, bool zeroed = true);
  ~DeviceTensor() override;
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  DeviceId device() const override { return device_.id(); }
  void* data() override { return data_; }
  DataType dtype() const override { return dtype_; }
  std::vector<int64_t> shape() const override { return shape_; }
  int64_t numel() const override { return numel_; }

 private:
  Device& device_;
  DataType dtype_;
  std::vector<int64_t> shape_;
  int64_t numel_ = 1;
  void* data_ = nullptr;
};

}  // namespace hvdtorch
