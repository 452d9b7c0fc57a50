#include "engine/tensor.h"

namespace hvdtorch {

HostTensor::HostTensor(DataType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = 1;
  for (int64_t d : shape_) numel_ *= d;
  storage_.resize(static_cast<size_t>(numel_) * dtypeSize(dtype_));
}

}  // namespace hvdtorch
