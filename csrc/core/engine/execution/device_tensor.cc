#include "engine/execution/device_tensor.h"

namespace hvdtorch {

DeviceTensor::DeviceTensor(Device& device, DataType dtype, std::vector<int64_t> shape, bool zeroed)
    : device_(device), dtype_(dtype), shape_(std::move(shape)) {
  for (int64_t d : shape_) numel_ *= d;
  // One byte at least: a device may refuse empty allocations.
  data_ = device_.allocate(bytes() > 0 ? bytes() : 1);
  if (zeroed) device_.fill(data_, bytes(), 0, nullptr);
}

DeviceTensor::~DeviceTensor() { device_.release(data_); }

}  // namespace hvdtorch
