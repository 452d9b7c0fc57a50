#include "device/cpu_device.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "device/reduce_kernels.h"

namespace hvdtorch {

namespace {
class CpuStream : public Stream {};
class CpuEvent : public Event {};
}  // namespace

Device& cpuDevice() {
  static CpuDevice device;
  return device;
}

void* CpuDevice::allocate(size_t bytes) {
  void* p = nullptr;
  // 64-byte aligned, like the fusion buffer, so the kernels vectorise.
  if (posix_memalign(&p, 64, bytes == 0 ? 64 : bytes) != 0) throw std::bad_alloc();
  return p;
}

void CpuDevice::release(void* p) { std::free(p); }

void CpuDevice::copy(void* dst, const void* src, size_t bytes, Stream*) {
  if (bytes != 0 && dst != src) std::memmove(dst, src, bytes);
}

void CpuDevice::copyToHost(void* host_dst, const void* src, size_t bytes, Stream* s) { copy(host_dst, src, bytes, s); }

void CpuDevice::copyFromHost(void* dst, const void* host_src, size_t bytes, Stream* s) {
  copy(dst, host_src, bytes, s);
}

void CpuDevice::fill(void* dst, size_t bytes, uint8_t byte, Stream*) {
  if (bytes != 0) std::memset(dst, byte, bytes);
}

void CpuDevice::reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op, Stream*) {
  hvdtorch::reduceInto(dst, src, count, dtype, op);
}

void CpuDevice::copyScaled(void* dst, const void* src, size_t count, DataType dtype, double factor, Stream*) {
  hvdtorch::copyScaled(dst, src, count, dtype, factor);
}

void CpuDevice::copyAveraged(void* dst, const void* src, size_t count, DataType dtype, int64_t divisor, double factor,
                             Stream*) {
  hvdtorch::copyAveraged(dst, src, count, dtype, divisor, factor);
}

std::unique_ptr<Stream> CpuDevice::newStream() { return std::make_unique<CpuStream>(); }
std::unique_ptr<Stream> CpuDevice::wrapStream(void*) { return std::make_unique<CpuStream>(); }
std::unique_ptr<Event> CpuDevice::newEvent(bool) { return std::make_unique<CpuEvent>(); }
void CpuDevice::record(Event&, Stream*) {}
void CpuDevice::wait(Stream*, Event&) {}
bool CpuDevice::query(Event&) { return true; }
void CpuDevice::synchronize(Event&) {}

}  // namespace hvdtorch
