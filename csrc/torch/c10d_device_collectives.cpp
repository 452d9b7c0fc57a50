#include "c10d_device_collectives.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>

#include "c10d_link.h"
#include "common/error.h"
#include "torch_tensor.h"

#ifdef HVDTORCH_HAVE_CUDA_DEVICE
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "device/cuda_device.h"
#endif

namespace hvdtorch {

std::atomic<uint64_t> C10dDeviceCollectives::runs_{0};

// The stream the backend's collective is issued on, and the two events that
// order it after the engine stream's work and before its later work.
struct C10dDeviceCollectives::Side {
#ifdef HVDTORCH_HAVE_CUDA_DEVICE
  c10::cuda::CUDAStream stream;
#endif
  std::unique_ptr<Stream> wrapped;
  std::unique_ptr<Event> before;
  std::unique_ptr<Event> after;
};

C10dDeviceCollectives::C10dDeviceCollectives(c10::intrusive_ptr<c10d::ProcessGroup> device_pg,
                                             c10::intrusive_ptr<c10d::ProcessGroup> host_pg)
    : device_pg_(std::move(device_pg)), host_pg_(std::move(host_pg)) {}

C10dDeviceCollectives::~C10dDeviceCollectives() = default;

bool C10dDeviceCollectives::reduces(Device& device, DataType dtype, ReduceOp op) {
  // Neither NCCL nor Gloo reduces int16; their bool reductions are not ours.
  if (dtype == DataType::kInt16 || dtype == DataType::kBool) return false;
  if (op != ReduceOp::kSum && op != ReduceOp::kMin && op != ReduceOp::kMax && op != ReduceOp::kProduct) return false;
  return usable(device);
}

bool C10dDeviceCollectives::usable(Device& device) {
  auto it = usable_.find(&device);
  if (it != usable_.end()) return it->second;
  bool ok = device.id().kind == DeviceKind::kSim;
#ifdef HVDTORCH_HAVE_CUDA_DEVICE
  if (device.id().kind == DeviceKind::kCuda) {
    // Every rank's GPU UUID, over the host group: equal UUIDs are one GPU.
    const int size = host_pg_->getSize();
    const std::array<uint8_t, 16> uuid = cudaDeviceUuid(device.id().index);
    at::Tensor mine = at::empty({16}, at::kByte);
    std::memcpy(mine.data_ptr(), uuid.data(), uuid.size());
    std::vector<std::vector<at::Tensor>> all(1);
    for (int r = 0; r < size; ++r) all[0].push_back(at::empty({16}, at::kByte));
    std::vector<at::Tensor> in{mine};
    try {
      host_pg_->allgather(all, in)->wait();
    } catch (const std::exception& e) {
      throw CollectiveError(strCat("comparing the ranks' GPUs before the first NCCL all-reduce: ", e.what()));
    }
    ok = true;
    for (int a = 0; a < size && ok; ++a)
      for (int b = a + 1; b < size && ok; ++b)
        if (std::memcmp(all[0][a].data_ptr(), all[0][b].data_ptr(), 16) == 0) {
          ok = false;
          if (host_pg_->getRank() == 0)
            std::fprintf(stderr,
                         "hvdtorch: ranks %d and %d share a GPU; NCCL needs one GPU per rank, so device tensors "
                         "are reduced by the device ring on one host (reducer \"auto\" or \"ring\") and staged "
                         "through the host otherwise\n",
                         a, b);
        }
  }
#endif
  usable_[&device] = ok;
  return ok;
}

bool C10dDeviceCollectives::moves(Device& device) { return usable(device); }

namespace {

at::Tensor onDevice(void* data, size_t count, DataType dtype, const at::Device& where) {
  return at::from_blob(data, {static_cast<int64_t>(count)},
                       at::TensorOptions().dtype(toScalarType(dtype)).device(where));
}

}  // namespace

void C10dDeviceCollectives::allreduce(Device& device, void* data, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0) return;
  const size_t bytes = count * dtypeSize(dtype);
  run(device, "all-reduce", data, bytes, data, bytes, [&](void*, void* buffer, const at::Device& where) {
    std::vector<at::Tensor> t{onDevice(buffer, count, dtype, where)};
    c10d::AllreduceOptions opts;
    opts.reduceOp = toC10dOp(op);
    device_pg_->allreduce(t, opts)->wait();
  });
}

void C10dDeviceCollectives::reducescatter(Device& device, const void* in, void* out, size_t block_count, DataType dtype,
                                          ReduceOp op) {
  if (block_count == 0) return;
  const size_t block = block_count * dtypeSize(dtype);
  const size_t size = static_cast<size_t>(device_pg_->getSize());
  run(device, "reduce-scatter", in, block * size, out, block, [&](void* src, void* dst, const at::Device& where) {
    at::Tensor input = onDevice(src, block_count * size, dtype, where);
    at::Tensor output = onDevice(dst, block_count, dtype, where);
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = toC10dOp(op);
    device_pg_->_reduce_scatter_base(output, input, opts)->wait();
  });
}

void C10dDeviceCollectives::broadcast(Device& device, void* data, size_t bytes, int root) {
  if (bytes == 0) return;
  run(device, "broadcast", data, bytes, data, bytes, [&](void*, void* buffer, const at::Device& where) {
    std::vector<at::Tensor> t{onDevice(buffer, bytes, DataType::kUInt8, where)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    device_pg_->broadcast(t, opts)->wait();
  });
}

void C10dDeviceCollectives::allgather(Device& device, const void* in, void* out, size_t block_bytes) {
  if (block_bytes == 0) return;
  const size_t size = static_cast<size_t>(device_pg_->getSize());
  run(device, "all-gather", in, block_bytes, out, block_bytes * size,
      [&](void* src, void* dst, const at::Device& where) {
        at::Tensor input = onDevice(src, block_bytes, DataType::kUInt8, where);
        at::Tensor output = onDevice(dst, block_bytes * size, DataType::kUInt8, where);
        device_pg_->_allgather_base(output, input)->wait();
      });
}

void C10dDeviceCollectives::alltoall(Device& device, const void* in, void* out, const std::vector<size_t>& send_bytes,
                                     const std::vector<size_t>& recv_bytes) {
  std::vector<int64_t> send(send_bytes.begin(), send_bytes.end());
  std::vector<int64_t> recv(recv_bytes.begin(), recv_bytes.end());
  const size_t in_bytes = std::accumulate(send_bytes.begin(), send_bytes.end(), size_t(0));
  const size_t out_bytes = std::accumulate(recv_bytes.begin(), recv_bytes.end(), size_t(0));
  run(device, "all-to-all", in, in_bytes, out, out_bytes, [&](void* src, void* dst, const at::Device& where) {
    at::Tensor input = onDevice(src, in_bytes, DataType::kUInt8, where);
    at::Tensor output = onDevice(dst, out_bytes, DataType::kUInt8, where);
    device_pg_->alltoall_base(output, input, recv, send)->wait();
  });
}

void C10dDeviceCollectives::run(Device& device, const char* what, const void* in, size_t in_bytes, void* out,
                                size_t out_bytes, const Collective& collective) {
  try {
    if (device.id().kind == DeviceKind::kSim) {
      runStaged(device, in, in_bytes, out, out_bytes, collective);
    } else {
      runOnSideStream(device, in, out, collective);
    }
  } catch (const CollectiveError&) {
    throw;
  } catch (const std::exception& e) {
    throw CollectiveError(strCat("rank ", device_pg_->getRank(), ": ", device_pg_->getBackendName(), " ", what, " of ",
                                 std::max(in_bytes, out_bytes), " bytes on ", device.id().str(),
                                 " failed: ", e.what()));
  }
  runs_.fetch_add(1);
}

// Pinned host copies and the (Gloo) group's CPU collective; the host waits
// for the device here, which NCCL never needs.
void C10dDeviceCollectives::runStaged(Device& device, const void* in, size_t in_bytes, void* out, size_t out_bytes,
                                      const Collective& collective) {
  struct Reset {
    StagingPool& pool;
    ~Reset() { pool.reset(); }
  } reset{bounce_};
  void* host_in = bounce_.take(in_bytes, device);
  void* host_out = in == out ? host_in : bounce_.take(out_bytes, device);
  if (in_bytes > 0) device.copyToHost(host_in, in, in_bytes, nullptr);
  device.synchronize(*drainEngineStream(device));
  collective(host_in, host_out, at::Device(at::kCPU));
  if (out_bytes > 0) device.copyFromHost(out, host_out, out_bytes, nullptr);
  device.synchronize(*drainEngineStream(device));  // the pool is reused by the next call
}

void C10dDeviceCollectives::runOnSideStream(Device& device, const void* in, void* out, const Collective& collective) {
#ifdef HVDTORCH_HAVE_CUDA_DEVICE
  const auto index = static_cast<c10::DeviceIndex>(device.id().index);
  c10::cuda::CUDAGuard on_device(index);
  std::unique_ptr<Side>& side = side_[&device];
  if (!side) {
    side = std::make_unique<Side>(Side{c10::cuda::getStreamFromPool(/*isHighPriority=*/true, index)});
    side->wrapped = device.wrapStream(side->stream.stream());
    side->before = device.newEvent();
    side->after = device.newEvent();
  }
  device.record(*side->before, nullptr);
  device.wait(side->wrapped.get(), *side->before);
  {
    // ProcessGroupNCCL orders its own stream after the current one, and
    // Work::wait() orders the current one after the collective, without the host.
    c10::cuda::CUDAStreamGuard on_side(side->stream);
    collective(const_cast<void*>(in), out, at::Device(at::kCUDA, index));
  }
  device.record(*side->after, side->wrapped.get());
  device.wait(nullptr, *side->after);
#else
  (void)in;
  (void)out;
  (void)collective;
  throw InvalidArgument(strCat("this build has no CUDA device; ", device.id().str(), " has no device collectives"));
#endif
}

}  // namespace hvdtorch
