// The CPU Device: every operation against values written out by hand, and
// the stream/event contract (complete as soon as recorded on the host).
#include <cstring>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "device/cpu_device.h"

using namespace hvdtorch;

TEST(cpu_device_identity) {
  Device& d = cpuDevice();
  CHECK(d.id() == (DeviceId{DeviceKind::kCpu, -1}));
  CHECK(d.id().str() == "cpu");
  CHECK((DeviceId{DeviceKind::kCuda, 3}).str() == "cuda:3");
  CHECK(&d == &cpuDevice());
}

TEST(cpu_device_memory_and_copies) {
  Device& d = cpuDevice();
  auto* p = static_cast<int32_t*>(d.allocate(64 * sizeof(int32_t)));
  CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
  d.fill(p, 64 * sizeof(int32_t), 0xff, nullptr);
  for (int i = 0; i < 64; ++i) CHECK(p[i] == -1);
  std::vector<int32_t> host(64);
  for (int i = 0; i < 64; ++i) host[i] = i * 3;
  d.copyFromHost(p, host.data(), 64 * sizeof(int32_t), nullptr);
  std::vector<int32_t> back(64, 0);
  d.copyToHost(back.data(), p, 64 * sizeof(int32_t), nullptr);
  CHECK(back == host);
  d.copy(p, p + 8, 8 * sizeof(int32_t), nullptr);  // overlapping ranges are fine
  CHECK(p[0] == 24 && p[7] == 45);
  d.release(p);
}

TEST(cpu_device_kernels) {
  Device& d = cpuDevice();
  float a[4] = {1.f, -2.f, 3.f, 0.5f};
  const float b[4] = {4.f, 5.f, -6.f, 2.f};
  d.reduceInto(a, b, 4, DataType::kFloat32, ReduceOp::kSum, nullptr);
  CHECK(a[0] == 5.f && a[1] == 3.f && a[2] == -3.f && a[3] == 2.5f);
  d.reduceInto(a, b, 4, DataType::kFloat32, ReduceOp::kMin, nullptr);
  CHECK(a[0] == 4.f && a[1] == 3.f && a[2] == -6.f && a[3] == 2.f);
  d.reduceInto(a, b, 4, DataType::kFloat32, ReduceOp::kProduct, nullptr);
  CHECK(a[0] == 16.f && a[1] == 15.f && a[2] == 36.f && a[3] == 4.f);
  float s[4];
  d.copyScaled(s, a, 4, DataType::kFloat32, 0.5, nullptr);
  CHECK(s[0] == 8.f && s[3] == 2.f);
  int32_t sum[3] = {-7, 49, 9};
  int32_t avg[3];
  d.copyAveraged(avg, sum, 3, DataType::kInt32, 2, 1.0, nullptr);
  CHECK(avg[0] == -3 && avg[1] == 24 && avg[2] == 4);
  uint8_t x[2] = {1, 0}, y[2] = {0, 0};
  d.reduceInto(x, y, 2, DataType::kBool, ReduceOp::kMax, nullptr);
  CHECK(x[0] == 1 && x[1] == 0);
  CHECK_THROWS(d.reduceInto(a, b, 4, DataType::kFloat32, ReduceOp::kAverage, nullptr), InvalidArgument);
}

TEST(cpu_device_streams_and_events) {
  Device& d = cpuDevice();
  auto s1 = d.newStream();
  auto s2 = d.wrapStream(nullptr);
  auto e = d.newEvent();
  auto ipc = d.newEvent(true);
  CHECK(s1 && s2 && e && ipc);
  d.record(*e, s1.get());
  d.wait(s2.get(), *e);
  CHECK(d.query(*e));
  d.synchronize(*e);
}

HVD_TEST_MAIN()
