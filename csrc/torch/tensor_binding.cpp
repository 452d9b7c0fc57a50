#include "tensor_binding.h"

#include <ATen/ops/empty.h>

#include <cstring>

#include "common/error.h"
#include "config/config.h"
#include "device/devices.h"
#include "output_pool.h"
#include "torch_tensor.h"

#ifdef HVDTORCH_HAVE_CUDA_DEVICE
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "device/cuda_device.h"
#endif

namespace hvdtorch {

namespace {

constexpr DeviceId kSimDevice{DeviceKind::kSim, 0};

// A CPU tensor handed to the engine as simulated-device memory (sim mode).
class SimBoundTensor : public TensorBuffer {
 public:
  SimBoundTensor(at::Tensor host, DataType dtype, std::shared_ptr<Event> ready)
      : host_(std::move(host)), dtype_(dtype), dev_(deviceFor(kSimDevice)), ready_(std::move(ready)) {
    data_ = dev_.allocate(std::max<size_t>(bytes(), 1));
  }
  ~SimBoundTensor() override { dev_.release(data_); }
  DeviceId device() const override { return kSimDevice; }
  std::shared_ptr<Event> ready() const override { return ready_; }
  void* data() override { return data_; }
  DataType dtype() const override { return dtype_; }
  std::vector<int64_t> shape() const override { return host_.sizes().vec(); }
  int64_t numel() const override { return host_.numel(); }
  const at::Tensor& host() const { return host_; }

 private:
  at::Tensor host_;
  DataType dtype_;
  Device& dev_;
  std::shared_ptr<Event> ready_;
  void* data_ = nullptr;
};

// The simulated "current stream" of the calling thread.
Stream& simCallerStream() {
  thread_local std::unique_ptr<Stream> stream = deviceFor(kSimDevice).newStream();
  return *stream;
}

void syncSimCaller() {
  Device& dev = deviceFor(kSimDevice);
  auto done = dev.newEvent();
  dev.record(*done, &simCallerStream());
  dev.synchronize(*done);
}

bool readSimMode() { return Config::loadFromEnvironment({"SIM_DEVICE"}).sim_device; }

DeviceId deviceOf(const at::Tensor& t) {
  if (t.is_cuda()) return DeviceId{DeviceKind::kCuda, t.get_device()};
  return DeviceId{};
}

}  // namespace

bool simDeviceMode() {
  static const bool on = readSimMode();
  return on;
}

std::shared_ptr<Event> OpBinding::readyEvent(DeviceId id) {
  if (ready_) return ready_;
  Device& dev = deviceFor(id);
  ready_ = dev.newEvent();
#ifdef HVDTORCH_HAVE_CUDA_DEVICE
  const auto stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(id.index));
  auto wrapped = dev.wrapStream(stream.stream());
  dev.record(*ready_, wrapped.get());
#endif
  return ready_;
}

DataType OpBinding::check(const at::Tensor& t, const std::string& where) {
  if (t.is_sparse()) throw InvalidArgument(strCat(where, ": sparse tensors are not supported; densify them first"));
  if (!t.is_contiguous()) throw InvalidArgument(strCat(where, ": tensor must be contiguous"));
  const DataType dtype = toDataType(t.scalar_type(), where);
  if (t.is_cuda()) {
    if (!deviceKindAvailable(DeviceKind::kCuda))
      throw InvalidArgument(strCat(where, ": tensor is on ", t.device().str(),
                                   ", but this hvdtorch build has no CUDA support (it was built against a CPU "
                                   "build of torch, or without nvcc); `python -m hvdtorch.check` says which"));
  } else if (!t.device().is_cpu()) {
    throw InvalidArgument(strCat(where, ": tensor is on ", t.device().str(), "; hvdtorch serves CPU and CUDA tensors"));
  }
  return dtype;
}

TensorPtr OpBinding::bind(const at::Tensor& t) {
  const DataType dtype = check(t, where_);
  if (t.is_cuda()) return std::make_shared<TorchTensor>(t, dtype, deviceOf(t), readyEvent(deviceOf(t)));
  if (!simDeviceMode()) return std::make_shared<TorchTensor>(t, dtype);
  for (const auto& [host, buffer] : bound_)
    if (host == t.data_ptr() && buffer->bytes() == t.nbytes()) return buffer;  // in place
  // One event for the op, recorded again after each tensor's copy: the
  // engine's wait binds to the last record, after every copy (one stream).
  Device& dev = deviceFor(kSimDevice);
  if (!ready_) ready_ = dev.newEvent();
  auto buffer = std::make_shared<SimBoundTensor>(t, dtype, ready_);
  dev.copyFromHost(buffer->data(), t.data_ptr(), t.nbytes(), &simCallerStream());
  dev.record(*ready_, &simCallerStream());
  bound_.emplace_back(t.data_ptr(), buffer);
  return buffer;
}

std::vector<TensorPtr> OpBinding::bindAll(const std::vector<at::Tensor>& ts) {
  std::vector<TensorPtr> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(bind(t));
  return out;
}

OutputAllocator OpBinding::allocatorLike(const at::Tensor& t) {
  const at::TensorOptions opts = t.options();
  const bool sim = simDeviceMode() && t.device().is_cpu();
  return [opts, sim](DataType dtype, const std::vector<int64_t>& shape) -> TensorPtr {
    if (sim) return std::make_shared<SimBoundTensor>(at::empty(shape, opts.dtype(toScalarType(dtype))), dtype, nullptr);
#ifdef HVDTORCH_HAVE_CUDA_DEVICE
    if (opts.device().is_cuda()) {
      // Made on the engine stream, which writes it first: the caching
      // allocator then hands out no block another stream may still be using
      // (collectOutputs records the caller's stream on it afterwards).
      const DeviceId id{DeviceKind::kCuda, opts.device().index()};
      const c10::DeviceIndex index = opts.device().index();
      c10::cuda::CUDAStreamGuard on_engine(
          c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(cudaEngineStream(deviceFor(id))), index));
      at::Tensor out = at::empty(shape, opts.dtype(toScalarType(dtype)));
      return std::make_shared<TorchTensor>(out, dtype, id, nullptr);
    }
#endif
    // Host outputs come from the output pool (output_pool.h): a repeated op reuses mapped memory.
    at::Tensor out = opts.device().is_cpu() ? OutputPool::instance().empty(shape, toScalarType(dtype))
                                            : at::empty(shape, opts.dtype(toScalarType(dtype)));
    return std::make_shared<TorchTensor>(out, dtype, deviceOf(out), nullptr);
  };
}

const at::Tensor& boundTensor(const TensorBuffer& buffer) {
  if (const auto* sim = dynamic_cast<const SimBoundTensor*>(&buffer)) return sim->host();
  return static_cast<const TorchTensor&>(buffer).tensor();
}

namespace {

// Host metadata an op made itself (alltoall's received splits), whatever
// the op's device: handed back as a CPU copy.
bool isHostMetadata(const TensorBuffer& t) { return dynamic_cast<const HostTensor*>(&t) != nullptr; }

}  // namespace

std::vector<at::Tensor> collectOutputs(const OpState& state) {
  std::vector<at::Tensor> out;
  const std::vector<TensorPtr>& outputs = state.outputs();
  if (state.device.kind == DeviceKind::kSim) {
    Device& dev = deviceFor(state.device);
    if (state.completion) dev.wait(&simCallerStream(), *state.completion);
    for (const auto& t : outputs) {
      if (isHostMetadata(*t)) continue;
      const at::Tensor& host = boundTensor(*t);
      dev.copyToHost(host.data_ptr(), t->data(), t->bytes(), &simCallerStream());
    }
    syncSimCaller();
  }
#ifdef HVDTORCH_HAVE_CUDA_DEVICE
  if (state.device.kind == DeviceKind::kCuda) {
    Device& dev = deviceFor(state.device);
    const auto stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(state.device.index));
    if (state.completion) {
      auto wrapped = dev.wrapStream(stream.stream());
      dev.wait(wrapped.get(), *state.completion);
    }
    for (const auto& t : outputs) {
      if (isHostMetadata(*t)) continue;
      const at::Tensor& o = boundTensor(*t);
      if (o.is_cuda()) c10::cuda::CUDACachingAllocator::recordStream(o.storage().data_ptr(), stream);
    }
  }
#endif
  for (const auto& t : outputs) {
    if (isHostMetadata(*t)) {
      out.push_back(at::empty(t->shape(), at::TensorOptions().dtype(toScalarType(t->dtype()))));
      std::memcpy(out.back().data_ptr(), t->data(), t->bytes());
    } else {
      out.push_back(boundTensor(*t));
    }
  }
  return out;
}

void installDeviceMakers() {
#ifdef HVDTORCH_HAVE_CUDA_DEVICE
  setDeviceMaker(DeviceKind::kCuda, [](int index) { return makeCudaDevice(index); });
#endif
}

}  // namespace hvdtorch
