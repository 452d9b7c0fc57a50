// The host as a Device: operations run to completion on the calling thread
// with the kernels of reduce_kernels.h; streams and events only satisfy the
// interface (an event is complete as soon as it is recorded).
#pragma once

#include "device/device.h"

namespace hvdtorch {

class CpuDevice : public Device {
 public:
  DeviceId id() const override { return DeviceId{DeviceKind::kCpu, -1}; }
  void* allocate(size_t bytes) override;
  void release(void* p) override;
  void copy(void* dst, const void* src, size_t bytes, Stream* stream) override;
  void copyToHost(void* host_dst, const void* src, size_t bytes, Stream* stream) override;
  void copyFromHost(void* dst, const void* host_src, size_t bytes, Stream* stream) override;
  void fill(void* dst, size_t bytes, uint8_t byte, Stream* stream) override;
  void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op, Stream* stream) override;
  void copyScaled(void* dst, const void* src, size_t count, DataType dtype, double factor, Stream* stream) override;
  void copyAveraged(void* dst, const void* src, size_t count, DataType dtype, int64_t divisor, double factor,
                    Stream* stream) override;
  std::unique_ptr<Stream> newStream() override;
  std::unique_ptr<Stream> wrapStream(void* native) override;
  std::unique_ptr<Event> newEvent(bool interprocess) override;
  void record(Event& event, Stream* stream) override;
  void wait(Stream* stream, Event& event) override;
  bool query(Event& event) override;
  void synchronize(Event& event) override;
};

}  // namespace hvdtorch
