// A Device is where a buffer lives, and the few operations the engine needs
// on memory there without the host ever touching it: copies, the element-wise
// reduce and scale kernels, fill, and ordering through streams and events.
// Core stays torch-free and CUDA-free: this header names no CUDA type. The
// CPU implementation (cpu_device.h) runs the kernels of reduce_kernels.h; the
// CUDA one (cuda_device.h, built from .cu files by nvcc) runs the same
// arithmetic on the GPU; the simulated one (sim_device.h) runs the CPU
// kernels on memory the host cannot read, on stream threads, so that tests
// without a GPU catch host dereferences and missing waits.
//
// Contract (every implementation keeps it):
//  * Pointers passed to an operation are memory of this device, except the
//    host side of copyToHost/copyFromHost (which should be pinned for the
//    copy to be asynchronous on a GPU).
//  * Every operation is enqueued on `stream` (nullptr: the device's own
//    engine stream) and may return before it ran. Later operations on the
//    same stream see its results; other streams only after a wait() on an
//    event recorded after it. On the CPU every operation has finished when
//    the call returns, and events are complete as soon as recorded.
//  * The host never waits on the submit path: ordering between the caller's
//    stream and the engine's goes through record()/wait(). synchronize() is
//    for callers that need values on the host.
//  * Arithmetic is that of reduce_kernels.h, whatever the device: float16 and
//    bfloat16 are widened to float and rounded once; bool Sum/Max is OR and
//    Min/Product AND; integer Average divides exactly, truncating toward
//    zero, before the factor. Results are bit-identical across devices for
//    the integer types and for one reduction of two float buffers.
//  * Invalid arguments (an op that is not element-wise, scaling a bool
//    tensor, a divisor <= 0) throw InvalidArgument from the call itself,
//    before anything is enqueued.
//  * Events: a wait binds to the most recent record at the time of the wait
//    call (a later record of the same event does not move it); an event
//    never recorded is complete. A stream destroyed with work pending still
//    runs that work.
//  * Failures throw CollectiveError naming the device and the operation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/dtype.h"

namespace hvdtorch {

enum class DeviceKind : uint8_t { kCpu = 0, kCuda = 1, kSim = 2 };
constexpr unsigned kDeviceKinds = 3;
const char* deviceKindName(DeviceKind kind);  // "cpu", "cuda", "sim"

struct DeviceId {
  DeviceKind kind = DeviceKind::kCpu;
  int index = -1;  // the CUDA ordinal, the simulated device's number; -1 for the CPU
  bool operator==(const DeviceId& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const DeviceId& o) const { return !(*this == o); }
  std::string str() const;  // "cpu", "cuda:1", "sim:0"
};

// Opaque handles; each implementation defines what is inside.
class Stream {
 public:
  virtual ~Stream() = default;
};
class Event {
 public:
  virtual ~Event() = default;
};

// Names a device allocation or an interprocess event for another process on
// the same host (CUDA IPC's 64-byte handles, and the same size here): plain
// bytes, to be sent over a pipe, a socket or shared memory as they are.
struct IpcMemoryHandle {
  char bytes[64] = {};
};
struct IpcEventHandle {
  char bytes[64] = {};
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceId id() const = 0;

  // Device memory, for scratch and staging buffers the engine owns.
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) = 0;

  virtual void copy(void* dst, const void* src, size_t bytes, Stream* stream) = 0;
  virtual void copyToHost(void* host_dst, const void* src, size_t bytes, Stream* stream) = 0;
  virtual void copyFromHost(void* dst, const void* host_src, size_t bytes, Stream* stream) = 0;
  // Sets every byte of dst[0 .. bytes) to `byte`.
  virtual void fill(void* dst, size_t bytes, uint8_t byte, Stream* stream) = 0;

  // dst[i] = dst[i] (op) src[i]; op is Sum, Min, Max or Product.
  virtual void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op, Stream* stream) = 0;
  // dst[i] = src[i] * factor (dst may equal src).
  virtual void copyScaled(void* dst, const void* src, size_t count, DataType dtype, double factor, Stream* stream) = 0;
  // dst[i] = (src[i] / divisor) * factor, as copyAveraged in reduce_kernels.h.
  virtual void copyAveraged(void* dst, const void* src, size_t count, DataType dtype, int64_t divisor, double factor,
                            Stream* stream) = 0;

  // A new stream owned by the caller.
  virtual std::unique_ptr<Stream> newStream() = 0;
  // A stream made elsewhere (e.g. the framework's current stream, passed as
  // its native handle), not owned: the wrapper never destroys it.
  virtual std::unique_ptr<Stream> wrapStream(void* native) = 0;
  // An event that can be recorded and waited on; `interprocess` ones can be
  // shared with another process on the same device (CUDA IPC).
  virtual std::unique_ptr<Event> newEvent(bool interprocess = false) = 0;
  virtual void record(Event& event, Stream* stream) = 0;
  // Work enqueued on `stream` after this call starts once `event` completed.
  virtual void wait(Stream* stream, Event& event) = 0;
  virtual bool query(Event& event) = 0;        // completed?
  virtual void synchronize(Event& event) = 0;  // blocks the host until completed

  // Pins host memory for asynchronous copies (cudaHostRegister): the
  // staging buffers the engine copies device data through are registered
  // once, when made, and unregistered before they are freed. A no-op where
  // host memory needs no pinning (the CPU); copies from memory that is not
  // registered still work, synchronously on a GPU.
  virtual void registerHost(void* host, size_t bytes);
  virtual void unregisterHost(void* host);

  // ---- interprocess sharing (optional; the default throws "not supported") --
  // Whether the calls below work on this device (a property of the device
  // and its options, the same on every rank with the same configuration).
  virtual bool interprocess() const { return false; }
  // Contract, CUDA IPC's:
  //  * exportMemory takes the base of an allocate() allocation (a handle names
  //    a whole allocation) and returns a handle for another process.
  //  * openMemory, in another process (never the exporter: a process cannot
  //    open its own handle), maps it and returns a device pointer to the same
  //    memory; closeMemory unmaps it. The exporter keeps the allocation alive
  //    until every peer closed it; peers never release() it.
  //  * exportEvent takes an event made with newEvent(true); openEvent gives
  //    the peer an Event it can wait on (and record) like a local one. Reads
  //    of shared memory after a wait on the peer's event see everything the
  //    peer's stream did before the record.
  virtual IpcMemoryHandle exportMemory(void* base);
  virtual void* openMemory(const IpcMemoryHandle& handle);
  virtual void closeMemory(void* opened);
  virtual IpcEventHandle exportEvent(Event& event);
  virtual std::unique_ptr<Event> openEvent(const IpcEventHandle& handle);

  // ---- stream flags (optional; the default throws "not supported") --------
  // 32-bit counters in device memory (an allocate() allocation, or memory
  // opened with openMemory; 4-byte aligned) that streams write and wait on,
  // so that a stream of one process waits for a stream of another without
  // either host waiting (cuStreamWriteValue32/cuStreamWaitValue32 on CUDA).
  // Contract:
  //  * writeFlag: once the stream's earlier work has finished, *flag = value;
  //    work that waited for the value sees everything that earlier work wrote.
  //  * waitFlag: the stream's later work starts once the counter reached
  //    `value`, compared modulo 2^32: (int32_t)(*flag - value) >= 0. Counters
  //    may wrap, as long as a wait's value is within 2^31 of the flag's.
  //  * A wait for a value nobody writes never ends, and with it everything
  //    queued behind it on the stream: issue a wait only for a write already
  //    enqueued by a live peer, and write far-ahead values into one's own
  //    flags (from another stream) to release the waits when a peer is gone.
  //    The simulated device reports such a wait (SimOptions::flag_timeout_ms).
  // Whether the two calls below work (a property of the device kind: the
  // CUDA and simulated devices; every device with interprocess() has them).
  virtual bool streamFlags() const { return false; }
  virtual void writeFlag(void* flag, uint32_t value, Stream* stream);
  virtual void waitFlag(const void* flag, uint32_t value, Stream* stream);
};

// The host: shared, stateless, always available.
Device& cpuDevice();

// Blocks the host until `device`'s engine stream has run everything enqueued
// so far; returns the event it recorded there (complete by then), which an
// op's completion hands to the framework.
std::shared_ptr<Event> drainEngineStream(Device& device);

}  // namespace hvdtorch
