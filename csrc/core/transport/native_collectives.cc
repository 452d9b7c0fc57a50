#include "transport/native_collectives.h"

#include "common/error.h"
#include "device/device.h"

namespace hvdtorch {

void NativeCollectives::allreduceOnDevice(Device& device, void* /*data*/, size_t /*count*/, DataType dtype,
                                          ReduceOp op) {
  throw InvalidArgument(strCat("the backend's collectives reduce no ", dtypeName(dtype), " ", reduceOpName(op), " on ",
                               device.id().str(), ": stage it through the host"));
}

void NativeCollectives::reducescatterOnDevice(Device& device, const void* /*in*/, void* /*out*/, size_t /*block_count*/,
                                              DataType dtype, ReduceOp op) {
  throw InvalidArgument(strCat("the backend's collectives reduce-scatter no ", dtypeName(dtype), " ", reduceOpName(op),
                               " on ", device.id().str(), ": stage it through the host"));
}

void NativeCollectives::broadcastOnDevice(Device& device, void* /*data*/, size_t /*bytes*/, int /*root*/) {
  throw InvalidArgument(
      strCat("the backend's collectives broadcast nothing on ", device.id().str(), ": stage it through the host"));
}

void NativeCollectives::allgatherOnDevice(Device& device, const void* /*in*/, void* /*out*/, size_t /*block_bytes*/) {
  throw InvalidArgument(
      strCat("the backend's collectives gather nothing on ", device.id().str(), ": stage it through the host"));
}

void NativeCollectives::alltoallOnDevice(Device& device, const void* /*in*/, void* /*out*/,
                                         const std::vector<size_t>& /*send_bytes*/,
                                         const std::vector<size_t>& /*recv_bytes*/) {
  throw InvalidArgument(
      strCat("the backend's collectives exchange nothing on ", device.id().str(), ": stage it through the host"));
}

}  // namespace hvdtorch
