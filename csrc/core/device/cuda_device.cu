// Device on a CUDA GPU: the reduce/scale kernels of reduce_kernels.h written
// for the GPU (float16/bfloat16 widened to float and rounded once, integer
// Average by exact division), 16-byte vector loads where both buffers are
// aligned, streams, events, and CUDA IPC for memory and events.
#include <cuda.h>  // the driver's types and flags only: its functions are reached through the runtime
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common/error.h"
#include "device/cuda_device.h"

namespace hvdtorch {

namespace {

void check(cudaError_t e, int ordinal, const char* what) {
  if (e != cudaSuccess) throw CollectiveError(strCat("cuda:", ordinal, ": ", what, " failed: ", cudaGetErrorString(e)));
}

// ---- element types: what a value is loaded as, and how it is stored back ---

template <typename T>
struct Widen {
  using type = T;
  __device__ static type load(T v) { return v; }
  __device__ static T store(type v) { return v; }
};
template <>
struct Widen<int8_t> {  // arithmetic in int, stored back truncated like the CPU's static_cast
  using type = int;
  __device__ static type load(int8_t v) { return v; }
  __device__ static int8_t store(type v) { return static_cast<int8_t>(v); }
};
template <>
struct Widen<uint8_t> {
  using type = int;
  __device__ static type load(uint8_t v) { return v; }
  __device__ static uint8_t store(type v) { return static_cast<uint8_t>(v); }
};
template <>
struct Widen<int16_t> {
  using type = int;
  __device__ static type load(int16_t v) { return v; }
  __device__ static int16_t store(type v) { return static_cast<int16_t>(v); }
};
template <>
struct Widen<__half> {
  using type = float;
  __device__ static type load(__half v) { return __half2float(v); }
  __device__ static __half store(type v) { return __float2half_rn(v); }
};
template <>
struct Widen<__nv_bfloat16> {
  using type = float;
  __device__ static type load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(type v) { return __float2bfloat16_rn(v); }
};

struct SumOp {
  template <typename C> __device__ static C apply(C a, C b) { return a + b; }
};
struct MinOp {
  template <typename C> __device__ static C apply(C a, C b) { return b < a ? b : a; }
};
struct MaxOp {
  template <typename C> __device__ static C apply(C a, C b) { return a < b ? b : a; }
};
struct ProdOp {
  template <typename C> __device__ static C apply(C a, C b) { return a * b; }
};
struct OrOp {  // bool Sum/Max
  template <typename C> __device__ static C apply(C a, C b) { return static_cast<C>((a | b) != 0); }
};
struct AndOp {  // bool Min/Product
  template <typename C> __device__ static C apply(C a, C b) { return static_cast<C>((a != 0) & (b != 0)); }
};

constexpr int kThreads = 256;

// Grid-stride loops; the launch caps the grid, every element is covered.
template <typename T, typename Op>
__global__ void reduceScalar(T* __restrict__ dst, const T* __restrict__ src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = Widen<T>::store(Op::apply(Widen<T>::load(dst[i]), Widen<T>::load(src[i])));
}

// 16 bytes per load and store: `packs` groups of 16 / sizeof(T) elements.
template <typename T, typename Op>
__global__ void reduceVector(T* __restrict__ dst, const T* __restrict__ src, size_t packs) {
  constexpr int kPer = 16 / sizeof(T);
  for (size_t p = blockIdx.x * size_t(blockDim.x) + threadIdx.x; p < packs; p += size_t(gridDim.x) * blockDim.x) {
    uint4 a = reinterpret_cast<const uint4*>(dst)[p];
    const uint4 b = reinterpret_cast<const uint4*>(src)[p];
    T* av = reinterpret_cast<T*>(&a);
    const T* bv = reinterpret_cast<const T*>(&b);
#pragma unroll
    for (int k = 0; k < kPer; ++k) av[k] = Widen<T>::store(Op::apply(Widen<T>::load(av[k]), Widen<T>::load(bv[k])));
    reinterpret_cast<uint4*>(dst)[p] = a;
  }
}

// Floating types scale in their compute type; integers in double, truncated
// toward zero (the CPU kernels' rule).
template <typename T>
__device__ T scaleOne(T v, double factor) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return v * static_cast<T>(factor);
  } else if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    return Widen<T>::store(Widen<T>::load(v) * static_cast<float>(factor));
  } else {
    return static_cast<T>(static_cast<double>(v) * factor);
  }
}

template <typename T>
__global__ void scaleKernel(T* dst, const T* src, size_t n, double factor) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = scaleOne(src[i], factor);
}

template <typename T>
__global__ void averageIntKernel(T* dst, const T* src, size_t n, int64_t divisor, double factor) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const T q = static_cast<T>(static_cast<int64_t>(src[i]) / divisor);
    dst[i] = factor == 1.0 ? q : scaleOne(q, factor);
  }
}

unsigned blocksFor(size_t n) {
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>((n + kThreads - 1) / kThreads, 4096)));
}

template <typename T, typename Op>
void launchReduce(void* dst, const void* src, size_t n, cudaStream_t s) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(src);
  constexpr size_t kPer = 16 / sizeof(T);
  size_t done = 0;
  if ((reinterpret_cast<uintptr_t>(d) % 16) == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0) {
    const size_t packs = n / kPer;
    if (packs > 0) reduceVector<T, Op><<<blocksFor(packs), kThreads, 0, s>>>(d, x, packs);
    done = packs * kPer;
  }
  if (done < n) reduceScalar<T, Op><<<blocksFor(n - done), kThreads, 0, s>>>(d + done, x + done, n - done);
}

template <typename T>
void launchReduceOp(void* dst, const void* src, size_t n, ReduceOp op, cudaStream_t s) {
  switch (op) {
    case ReduceOp::kSum: return launchReduce<T, SumOp>(dst, src, n, s);
    case ReduceOp::kMin: return launchReduce<T, MinOp>(dst, src, n, s);
    case ReduceOp::kMax: return launchReduce<T, MaxOp>(dst, src, n, s);
    case ReduceOp::kProduct: return launchReduce<T, ProdOp>(dst, src, n, s);
    default: break;
  }
  throw InvalidArgument(strCat("reduceInto: op ", reduceOpName(op), " is not an element-wise reduction"));
}

// Launcher<T>::run(args...) with the CUDA type of `dtype` (bool excluded).
template <template <typename> class Launcher, typename... Args>
void withType(DataType dtype, Args&&... args) {
  switch (dtype) {
    case DataType::kUInt8: return Launcher<uint8_t>::run(args...);
    case DataType::kInt8: return Launcher<int8_t>::run(args...);
    case DataType::kInt16: return Launcher<int16_t>::run(args...);
    case DataType::kInt32: return Launcher<int32_t>::run(args...);
    case DataType::kInt64: return Launcher<int64_t>::run(args...);
    case DataType::kFloat16: return Launcher<__half>::run(args...);
    case DataType::kBFloat16: return Launcher<__nv_bfloat16>::run(args...);
    case DataType::kFloat32: return Launcher<float>::run(args...);
    case DataType::kFloat64: return Launcher<double>::run(args...);
    case DataType::kBool: break;
  }
  throw InvalidArgument("scaling is not defined for bool tensors");
}

template <typename T>
struct ReduceLauncher {
  static void run(void* dst, const void* src, size_t n, ReduceOp op, cudaStream_t s) {
    launchReduceOp<T>(dst, src, n, op, s);
  }
};

template <typename T>
struct ScaleLauncher {
  static void run(void* dst, const void* src, size_t n, double factor, cudaStream_t s) {
    scaleKernel<T><<<blocksFor(n), kThreads, 0, s>>>(static_cast<T*>(dst), static_cast<const T*>(src), n, factor);
  }
};

// ---- stream flags ------------------------------------------------------------

// The driver's stream memory operations, found through the runtime
// (cudaGetDriverEntryPointByVersion) so that the library never links the
// driver itself; null where the driver does not offer them.
struct StreamMemOps {
  using Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  Fn wait = nullptr;
  Fn write = nullptr;
};

const StreamMemOps& streamMemOps() {
  static const StreamMemOps ops = [] {
    StreamMemOps o;
    cudaDriverEntryPointQueryResult found{};
    void* wait = nullptr;
    void* write = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &wait, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess &&
        cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &write, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      o.wait = reinterpret_cast<StreamMemOps::Fn>(wait);
      o.write = reinterpret_cast<StreamMemOps::Fn>(write);
    }
    return o;
  }();
  return ops;
}

// Stand-ins where the driver has no stream memory operations. Slow where
// two processes share a GPU (a spinning kernel holds its context's time
// slice: 4.5 ms per hand-over measured on an H200, against 9 us for the
// stream operations), but correct.
__global__ void waitFlagKernel(const volatile uint32_t* flag, uint32_t value) {
  while (static_cast<int32_t>(*flag - value) < 0) __nanosleep(200);
}
__global__ void writeFlagKernel(volatile uint32_t* flag, uint32_t value) {
  __threadfence_system();  // what the stream wrote before is visible first
  *flag = value;
}

class CudaStream : public Stream {
 public:
  CudaStream(cudaStream_t s, bool owned) : stream(s), owned_(owned) {}
  ~CudaStream() override {
    if (owned_) cudaStreamDestroy(stream);
  }
  cudaStream_t stream;

 private:
  bool owned_;
};

class CudaEvent : public Event {
 public:
  explicit CudaEvent(cudaEvent_t e) : event(e) {}
  ~CudaEvent() override { cudaEventDestroy(event); }
  cudaEvent_t event;
};

// Makes `ordinal` current for the calling thread, and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal) {
    cudaGetDevice(&previous_);
    if (previous_ != ordinal) check(cudaSetDevice(ordinal), ordinal, "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

class CudaDevice : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {
    DeviceGuard g(ordinal_);
    check(cudaStreamCreateWithFlags(&engine_stream_, cudaStreamNonBlocking), ordinal_, "cudaStreamCreate");
  }
  ~CudaDevice() override { cudaStreamDestroy(engine_stream_); }

  bool interprocess() const override { return true; }  // CUDA IPC
  DeviceId id() const override { return DeviceId{DeviceKind::kCuda, ordinal_}; }

  void* allocate(size_t bytes) override {
    DeviceGuard g(ordinal_);
    void* p = nullptr;
    check(cudaMalloc(&p, bytes == 0 ? 16 : bytes), ordinal_, "cudaMalloc");
    return p;
  }
  void release(void* p) override {
    DeviceGuard g(ordinal_);
    cudaFree(p);
  }

  void copy(void* dst, const void* src, size_t bytes, Stream* s) override {
    copyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s, "copy");
  }
  void copyToHost(void* host_dst, const void* src, size_t bytes, Stream* s) override {
    copyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, s, "copyToHost");
  }
  void copyFromHost(void* dst, const void* host_src, size_t bytes, Stream* s) override {
    copyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, s, "copyFromHost");
  }
  void fill(void* dst, size_t bytes, uint8_t byte, Stream* s) override {
    if (bytes == 0) return;
    DeviceGuard g(ordinal_);
    check(cudaMemsetAsync(dst, byte, bytes, native(s)), ordinal_, "fill");
  }

  void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op, Stream* s) override {
    if (count == 0) return;
    DeviceGuard g(ordinal_);
    const cudaStream_t st = native(s);
    if (dtype == DataType::kBool) {
      if (op == ReduceOp::kSum || op == ReduceOp::kMax) {
        launchReduce<uint8_t, OrOp>(dst, src, count, st);
      } else {
        launchReduce<uint8_t, AndOp>(dst, src, count, st);
      }
    } else {
      withType<ReduceLauncher>(dtype, dst, src, count, op, st);
    }
    check(cudaGetLastError(), ordinal_, "reduceInto kernel launch");
  }

  void copyScaled(void* dst, const void* src, size_t count, DataType dtype, double factor, Stream* s) override {
    if (count == 0) return;
    if (factor == 1.0) {
      if (dst != src) copy(dst, src, count * dtypeSize(dtype), s);
      return;
    }
    DeviceGuard g(ordinal_);
    withType<ScaleLauncher>(dtype, dst, src, count, factor, native(s));
    check(cudaGetLastError(), ordinal_, "copyScaled kernel launch");
  }

  void copyAveraged(void* dst, const void* src, size_t count, DataType dtype, int64_t divisor, double factor,
                    Stream* s) override {
    if (divisor <= 0) throw InvalidArgument(strCat("copyAveraged: divisor ", divisor, " is not positive"));
    if (divisor == 1 || isFloating(dtype)) return copyScaled(dst, src, count, dtype, factor / double(divisor), s);
    if (count == 0) return;
    DeviceGuard g(ordinal_);
    const cudaStream_t st = native(s);
    switch (dtype) {
      case DataType::kUInt8: launchAverage<uint8_t>(dst, src, count, divisor, factor, st); break;
      case DataType::kInt8: launchAverage<int8_t>(dst, src, count, divisor, factor, st); break;
      case DataType::kInt16: launchAverage<int16_t>(dst, src, count, divisor, factor, st); break;
      case DataType::kInt32: launchAverage<int32_t>(dst, src, count, divisor, factor, st); break;
      case DataType::kInt64: launchAverage<int64_t>(dst, src, count, divisor, factor, st); break;
      default: throw InvalidArgument(strCat("Average is not defined for ", dtypeName(dtype), " tensors"));
    }
    check(cudaGetLastError(), ordinal_, "copyAveraged kernel launch");
  }

  std::unique_ptr<Stream> newStream() override {
    DeviceGuard g(ordinal_);
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), ordinal_, "cudaStreamCreate");
    return std::make_unique<CudaStream>(s, true);
  }
  std::unique_ptr<Stream> wrapStream(void* native_stream) override {
    return std::make_unique<CudaStream>(static_cast<cudaStream_t>(native_stream), false);
  }
  std::unique_ptr<Event> newEvent(bool interprocess) override {
    DeviceGuard g(ordinal_);
    cudaEvent_t e = nullptr;
    const unsigned flags = cudaEventDisableTiming | (interprocess ? cudaEventInterprocess : 0u);
    check(cudaEventCreateWithFlags(&e, flags), ordinal_, "cudaEventCreate");
    return std::make_unique<CudaEvent>(e);
  }
  void record(Event& e, Stream* s) override {
    DeviceGuard g(ordinal_);
    check(cudaEventRecord(static_cast<CudaEvent&>(e).event, native(s)), ordinal_, "cudaEventRecord");
  }
  void wait(Stream* s, Event& e) override {
    DeviceGuard g(ordinal_);
    check(cudaStreamWaitEvent(native(s), static_cast<CudaEvent&>(e).event, 0), ordinal_, "cudaStreamWaitEvent");
  }
  bool query(Event& e) override {
    const cudaError_t r = cudaEventQuery(static_cast<CudaEvent&>(e).event);
    if (r == cudaErrorNotReady) return false;
    check(r, ordinal_, "cudaEventQuery");
    return true;
  }
  void synchronize(Event& e) override {
    check(cudaEventSynchronize(static_cast<CudaEvent&>(e).event), ordinal_, "cudaEventSynchronize");
  }
  // CUDA IPC. The handles are CUDA's own 64-byte structs, copied as bytes.
  IpcMemoryHandle exportMemory(void* base) override {
    DeviceGuard g(ordinal_);
    cudaIpcMemHandle_t h;
    check(cudaIpcGetMemHandle(&h, base), ordinal_, "cudaIpcGetMemHandle");
    IpcMemoryHandle out;
    static_assert(sizeof(h) <= sizeof(out.bytes), "CUDA IPC handle larger than IpcMemoryHandle");
    std::memcpy(out.bytes, &h, sizeof(h));
    return out;
  }
  void* openMemory(const IpcMemoryHandle& handle) override {
    DeviceGuard g(ordinal_);
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.bytes, sizeof(h));
    void* p = nullptr;
    check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), ordinal_, "cudaIpcOpenMemHandle");
    return p;
  }
  void closeMemory(void* opened) override {
    DeviceGuard g(ordinal_);
    check(cudaIpcCloseMemHandle(opened), ordinal_, "cudaIpcCloseMemHandle");
  }
  IpcEventHandle exportEvent(Event& event) override {
    DeviceGuard g(ordinal_);
    cudaIpcEventHandle_t h;
    check(cudaIpcGetEventHandle(&h, static_cast<CudaEvent&>(event).event), ordinal_, "cudaIpcGetEventHandle");
    IpcEventHandle out;
    static_assert(sizeof(h) <= sizeof(out.bytes), "CUDA IPC event handle larger than IpcEventHandle");
    std::memcpy(out.bytes, &h, sizeof(h));
    return out;
  }
  std::unique_ptr<Event> openEvent(const IpcEventHandle& handle) override {
    DeviceGuard g(ordinal_);
    cudaIpcEventHandle_t h;
    std::memcpy(&h, handle.bytes, sizeof(h));
    cudaEvent_t e = nullptr;
    check(cudaIpcOpenEventHandle(&e, h), ordinal_, "cudaIpcOpenEventHandle");
    return std::make_unique<CudaEvent>(e);
  }

  bool streamFlags() const override { return true; }
  void writeFlag(void* flag, uint32_t value, Stream* s) override {
    DeviceGuard g(ordinal_);
    const StreamMemOps& ops = streamMemOps();
    if (ops.write) {
      // The default flags: a memory barrier before the write, so the value
      // publishes what the stream wrote before it.
      const CUresult r =
          ops.write(native(s), reinterpret_cast<CUdeviceptr>(flag), value, CU_STREAM_WRITE_VALUE_DEFAULT);
      if (r != CUDA_SUCCESS)
        throw CollectiveError(strCat("cuda:", ordinal_, ": cuStreamWriteValue32 failed: error ", r));
    } else {
      writeFlagKernel<<<1, 1, 0, native(s)>>>(static_cast<uint32_t*>(flag), value);
      check(cudaGetLastError(), ordinal_, "writeFlag kernel launch");
    }
  }
  void waitFlag(const void* flag, uint32_t value, Stream* s) override {
    DeviceGuard g(ordinal_);
    const StreamMemOps& ops = streamMemOps();
    if (ops.wait) {
      const CUresult r = ops.wait(native(s), reinterpret_cast<CUdeviceptr>(flag), value, CU_STREAM_WAIT_VALUE_GEQ);
      if (r != CUDA_SUCCESS)
        throw CollectiveError(strCat("cuda:", ordinal_, ": cuStreamWaitValue32 failed: error ", r));
    } else {
      waitFlagKernel<<<1, 1, 0, native(s)>>>(static_cast<const uint32_t*>(flag), value);
      check(cudaGetLastError(), ordinal_, "waitFlag kernel launch");
    }
  }

  // Portable: the pinning holds for every device's copies, since one staging
  // buffer may serve tensors of several GPUs of this process.
  void registerHost(void* host, size_t bytes) override {
    if (host == nullptr || bytes == 0) return;
    check(cudaHostRegister(host, bytes, cudaHostRegisterPortable), ordinal_, "cudaHostRegister");
  }
  void unregisterHost(void* host) override {
    if (host == nullptr) return;
    check(cudaHostUnregister(host), ordinal_, "cudaHostUnregister");
  }

  cudaStream_t engineStream() const { return engine_stream_; }

 private:
  cudaStream_t native(Stream* s) const { return s ? static_cast<CudaStream*>(s)->stream : engine_stream_; }

  void copyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, Stream* s, const char* what) {
    if (bytes == 0 || dst == src) return;
    DeviceGuard g(ordinal_);
    check(cudaMemcpyAsync(dst, src, bytes, kind, native(s)), ordinal_, what);
  }

  template <typename T>
  static void launchAverage(void* dst, const void* src, size_t n, int64_t divisor, double factor, cudaStream_t s) {
    averageIntKernel<T>
        <<<blocksFor(n), kThreads, 0, s>>>(static_cast<T*>(dst), static_cast<const T*>(src), n, divisor, factor);
  }

  int ordinal_;
  cudaStream_t engine_stream_ = nullptr;
};

}  // namespace

int cudaDeviceCount(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device is visible";
  return n;
}

std::array<uint8_t, 16> cudaDeviceUuid(int ordinal) {
  cudaDeviceProp prop{};
  const cudaError_t e = cudaGetDeviceProperties(&prop, ordinal);
  if (e != cudaSuccess) throw CollectiveError(strCat("cuda:", ordinal, ": reading its UUID: ", cudaGetErrorString(e)));
  std::array<uint8_t, 16> uuid{};
  std::memcpy(uuid.data(), prop.uuid.bytes, uuid.size());
  return uuid;
}

void* cudaEngineStream(Device& device) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  if (!cuda) throw InvalidArgument(strCat(device.id().str(), " is not a CUDA device: it has no CUDA stream"));
  return cuda->engineStream();
}

std::unique_ptr<Device> makeCudaDevice(int ordinal) {
  std::string why;
  const int n = cudaDeviceCount(&why);
  if (ordinal < 0 || ordinal >= n)
    throw CollectiveError(strCat("cuda:", ordinal, ": no such device (", n, " visible", n == 0 ? ": " + why : "", ")"));
  return std::make_unique<CudaDevice>(ordinal);
}

}  // namespace hvdtorch
