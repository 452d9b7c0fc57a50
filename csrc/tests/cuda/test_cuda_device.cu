// The CUDA Device against the CPU one (whose kernels the other tests pin):
// every dtype x op of reduceInto, copyScaled and copyAveraged, bit-identical;
// vector and scalar paths (aligned and misaligned buffers, odd counts); and
// ordering between two streams through an event. Exits 77 (ctest: skipped)
// with the reason where no CUDA device is visible.
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "device/cpu_device.h"
#include "device/cuda_device.h"
#include "device/reduce_kernels.h"

using namespace hvdtorch;

namespace {

const DataType kTypes[] = {DataType::kUInt8,   DataType::kInt8,    DataType::kInt16,    DataType::kInt32,
                           DataType::kInt64,   DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                           DataType::kFloat64, DataType::kBool};

std::vector<char> randomBytes(DataType dt, size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<char> v(n * dtypeSize(dt));
  for (size_t i = 0; i < n; ++i) {
    int x = small(g);
    if (x == 0) x = 1;
    const float f = 0.37f * float(x) + 0.001f * float(i % 97);
    switch (dt) {
      case DataType::kUInt8: reinterpret_cast<uint8_t*>(v.data())[i] = uint8_t(x + 3); break;
      case DataType::kBool: reinterpret_cast<uint8_t*>(v.data())[i] = uint8_t(x > 0); break;
      case DataType::kInt8: reinterpret_cast<int8_t*>(v.data())[i] = int8_t(x); break;
      case DataType::kInt16: reinterpret_cast<int16_t*>(v.data())[i] = int16_t(x * 100); break;
      case DataType::kInt32: reinterpret_cast<int32_t*>(v.data())[i] = x * 100000 + int(i); break;
      case DataType::kInt64: reinterpret_cast<int64_t*>(v.data())[i] = (int64_t(x) << 40) + int64_t(i); break;
      case DataType::kFloat32: reinterpret_cast<float*>(v.data())[i] = f; break;
      case DataType::kFloat64: reinterpret_cast<double*>(v.data())[i] = double(f) * 1.0000001; break;
      case DataType::kFloat16: reinterpret_cast<uint16_t*>(v.data())[i] = floatToHalf(f); break;
      case DataType::kBFloat16: reinterpret_cast<uint16_t*>(v.data())[i] = floatToBf16(f); break;
    }
  }
  return v;
}

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
  for (DataType dt : kTypes) {
    for (size_t n : {size_t(1), size_t(7), size_t(1000), size_t(1 << 20) + 3}) {
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
