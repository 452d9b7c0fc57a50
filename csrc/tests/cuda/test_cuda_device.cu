// The CUDA Device: the device contract (device_contract.h, the same suite
// the CPU and simulated devices pass), and beyond it, against the CPU
// device, every dtype x op of reduceInto, copyScaled and copyAveraged on
// buffers large enough for the vector path and many blocks, bit-identical;
// and ordering between two streams through an event over 256 MiB. Exits 77
// (ctest: skipped) with the reason where no CUDA device is visible.
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "device/cpu_device.h"
#include "device/cuda_device.h"
#include "device/reduce_kernels.h"
#include "device_contract.h"

using namespace hvdtorch;
using hvdtorch::contract::kAllTypes;
using hvdtorch::contract::randomBytes;

hvdtorch::Device& hvdtorch::contract::contractDevice() {
  static const std::unique_ptr<Device> device = makeCudaDevice(0);
  return *device;
}

namespace {

// Runs `op` on the GPU over copies of a and b (b at byte offset `skew` to
// reach the misaligned path) and returns a's result bytes.
template <typename Op>
std::vector<char> onGpu(Device& gpu, const std::vector<char>& a, const std::vector<char>& b, size_t skew, Op op) {
  char* da = static_cast<char*>(gpu.allocate(a.size() + 64)) + skew;
  char* db = static_cast<char*>(gpu.allocate(b.size() + 64)) + skew;
  gpu.copyFromHost(da, a.data(), a.size(), nullptr);
  gpu.copyFromHost(db, b.data(), b.size(), nullptr);
  op(da, db);
  std::vector<char> out(a.size());
  gpu.copyToHost(out.data(), da, out.size(), nullptr);
  auto done = gpu.newEvent();
  gpu.record(*done, nullptr);
  gpu.synchronize(*done);
  gpu.release(da - skew);
  gpu.release(db - skew);
  return out;
}

}  // namespace

TEST(cuda_kernels_match_cpu_kernels) {
  auto gpu = makeCudaDevice(0);
  Device& cpu = cpuDevice();
  unsigned seed = 1;
  for (DataType dt : kAllTypes) {
    for (size_t n : {size_t(1000), size_t(1 << 20) + 3}) {
      for (size_t skew : {size_t(0), dtypeSize(dt)}) {  // vector path, and the misaligned scalar path
        const auto a = randomBytes(dt, n, seed++);
        const auto b = randomBytes(dt, n, seed++);
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
          std::vector<char> want = a;
          cpu.reduceInto(want.data(), b.data(), n, dt, op, nullptr);
          const auto got =
              onGpu(*gpu, a, b, skew, [&](void* x, void* y) { gpu->reduceInto(x, y, n, dt, op, nullptr); });
          CHECK_MSG(got == want, "reduceInto %s %s n=%zu skew=%zu", dtypeName(dt), reduceOpName(op), n, skew);
        }
        if (dt == DataType::kBool) continue;
        std::vector<char> want(a.size());
        cpu.copyScaled(want.data(), a.data(), n, dt, 0.5, nullptr);
        auto got = onGpu(*gpu, a, b, skew, [&](void* x, void* y) { gpu->copyScaled(x, y, n, dt, 0.5, nullptr); });
        std::vector<char> want_b(b.size());
        cpu.copyScaled(want_b.data(), b.data(), n, dt, 0.5, nullptr);
        CHECK_MSG(got == want_b, "copyScaled %s n=%zu", dtypeName(dt), n);
        cpu.copyAveraged(want.data(), b.data(), n, dt, 3, 2.0, nullptr);
        got = onGpu(*gpu, a, b, skew, [&](void* x, void* y) { gpu->copyAveraged(x, y, n, dt, 3, 2.0, nullptr); });
        CHECK_MSG(got == want, "copyAveraged %s n=%zu", dtypeName(dt), n);
      }
    }
  }
}

TEST(cuda_event_orders_two_streams) {
  // Stream 1 fills and reduces a large buffer; stream 2 waits on an event
  // recorded after that and copies the result out: it must see the final values.
  auto gpu = makeCudaDevice(0);
  const size_t n = size_t(64) << 20;
  auto* x = static_cast<float*>(gpu->allocate(n * sizeof(float)));
  auto* y = static_cast<float*>(gpu->allocate(n * sizeof(float)));
  auto s1 = gpu->newStream();
  auto s2 = gpu->newStream();
  gpu->fill(x, n * sizeof(float), 0, s1.get());
  gpu->fill(y, n * sizeof(float), 0, s1.get());
  std::vector<float> ones(n, 1.f);
  gpu->copyFromHost(y, ones.data(), n * sizeof(float), s1.get());
  for (int k = 0; k < 8; ++k) gpu->reduceInto(x, y, n, DataType::kFloat32, ReduceOp::kSum, s1.get());
  auto ready = gpu->newEvent();
  gpu->record(*ready, s1.get());
  gpu->wait(s2.get(), *ready);
  std::vector<float> out(n, -1.f);
  gpu->copyToHost(out.data(), x, n * sizeof(float), s2.get());
  auto done = gpu->newEvent();
  gpu->record(*done, s2.get());
  gpu->synchronize(*done);
  CHECK(gpu->query(*done));
  CHECK(out.front() == 8.f && out[n / 2] == 8.f && out.back() == 8.f);
  gpu->release(x);
  gpu->release(y);
}

int main() {
  std::string why;
  if (cudaDeviceCount(&why) == 0) {
    std::printf("SKIP: no CUDA device here (%s); this test runs where a GPU is visible\n", why.c_str());
    return 77;
  }
  for (auto& c : ::hvdtorch::test::registry()) {
    const int before = ::hvdtorch::test::failures();
    try {
      c.fn();
    } catch (const std::exception& e) {
      ++::hvdtorch::test::failures();
      std::fprintf(stderr, "%s: uncaught exception: %s\n", c.name, e.what());
    }
    std::printf("[%s] %s\n", ::hvdtorch::test::failures() == before ? "PASS" : "FAIL", c.name);
  }
  return ::hvdtorch::test::failures() == 0 ? 0 : 1;
}
