#include "device/device.h"

namespace hvdtorch {

std::string DeviceId::str() const {
  return kind == DeviceKind::kCpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

}  // namespace hvdtorch
