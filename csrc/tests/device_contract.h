// The Device contract (device/device.h), written once against `Device&` and
// compiled into one test binary per implementation: test_device_contract_cpu,
// test_device_contract_sim, and the CUDA test (tests/cuda). The including file
// defines contractDevice(), the device under test.
//
// Device memory is only ever touched through the device (copyFromHost,
// copyToHost), and host results are read only after synchronize() on an
// event recorded after the copy: on the simulated device a host read of
// device memory crashes, and a copy not yet run leaves stale bytes.
//
// Every kernel is compared, bit for bit, with the CPU reference kernels of
// device/reduce_kernels.h run on the host.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "device/device.h"
#include "device/reduce_kernels.h"

namespace hvdtorch::contract {

Device& contractDevice();

inline const DataType kAllTypes[] = {DataType::kUInt8,   DataType::kInt8,    DataType::kInt16,    DataType::kInt32,
                                     DataType::kInt64,   DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                                     DataType::kFloat64, DataType::kBool};

// Values that keep every op finite and exercise signs, ties and rounding;
// the product of two stays in range for every signed type (no overflow,
// which UBSan rejects).
inline std::vector<char> randomBytes(DataType dt, size_t n, unsigned seed) {
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
      case DataType::kInt32: reinterpret_cast<int32_t*>(v.data())[i] = x * 1000 + int(i % 1000); break;
      case DataType::kInt64:
        reinterpret_cast<int64_t*>(v.data())[i] = int64_t(x) * (int64_t(1) << 24) + int64_t(i);
        break;
      case DataType::kFloat32: reinterpret_cast<float*>(v.data())[i] = f; break;
      case DataType::kFloat64: reinterpret_cast<double*>(v.data())[i] = double(f) * 1.0000001; break;
      case DataType::kFloat16: reinterpret_cast<uint16_t*>(v.data())[i] = floatToHalf(f); break;
      case DataType::kBFloat16: reinterpret_cast<uint16_t*>(v.data())[i] = floatToBf16(f); break;
    }
  }
  return v;
}

// Blocks the host until everything enqueued on `s` so far has run.
inline void finish(Device& d, Stream* s) {
  auto e = d.newEvent();
  d.record(*e, s);
  d.synchronize(*e);
  CHECK(d.query(*e));
}

inline std::vector<char> toHost(Device& d, const void* src, size_t bytes, Stream* s = nullptr) {
  std::vector<char> out(bytes, '\x5a');
  d.copyToHost(out.data(), src, bytes, s);
  finish(d, s);
  return out;
}

// Device memory freed at scope exit (after the queued work, as release() is).
class Buffer {
 public:
  Buffer(Device& d, size_t bytes) : d_(d), p_(static_cast<char*>(d.allocate(bytes))) {}
  ~Buffer() { d_.release(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* get() const { return p_; }

 private:
  Device& d_;
  char* p_;
};

// Runs `op(a_dev, b_dev)` on device copies of a and b (at byte offset `skew`,
// to reach unaligned paths) and returns the bytes of a afterwards.
template <typename Op>
std::vector<char> onDevice(Device& d, const std::vector<char>& a, const std::vector<char>& b, size_t skew, Op op) {
  Buffer da(d, a.size() + 64), db(d, b.size() + 64);
  d.copyFromHost(da.get() + skew, a.data(), a.size(), nullptr);
  d.copyFromHost(db.get() + skew, b.data(), b.size(), nullptr);
  op(da.get() + skew, db.get() + skew);
  return toHost(d, da.get() + skew, a.size());
}

}  // namespace hvdtorch::contract

// ---- memory and copies ---------------------------------------------------------------

TEST(contract_copies_and_fill) {
  using namespace hvdtorch;
  using namespace hvdtorch::contract;
  Device& d = contractDevice();
  const size_t n = 1000;
  Buffer x(d, n), y(d, n);
  d.fill(x.get(), n, 0xab, nullptr);
  CHECK(toHost(d, x.get(), n) == std::vector<char>(n, '\xab'));
  std::vector<char> pattern(n);
  for (size_t i = 0; i < n; ++i) pattern[i] = char(i * 7 + 1);
  d.copyFromHost(x.get(), pattern.data(), n, nullptr);
  d.copy(y.get(), x.get(), n, nullptr);
  CHECK(toHost(d, y.get(), n) == pattern);
  d.fill(y.get() + 10, 5, 0, nullptr);  // interior ranges
  auto want = pattern;
  std::memset(want.data() + 10, 0, 5);
  CHECK(toHost(d, y.get(), n) == want);
  d.copy(x.get() + 500, y.get() + 8, 100, nullptr);
  std::memcpy(pattern.data() + 500, want.data() + 8, 100);
  CHECK(toHost(d, x.get(), n) == pattern);
  // Zero bytes touch nothing; allocate(0) gives memory release() takes.
  d.copy(x.get(), y.get(), 0, nullptr);
  d.fill(x.get(), 0, 1, nullptr);
  d.copyToHost(nullptr, x.get(), 0, nullptr);
  CHECK(toHost(d, x.get(), n) == pattern);
  void* empty = d.allocate(0);
  CHECK(empty != nullptr);
  d.release(empty);
}

// ---- kernels: every dtype x op against the reference, bit-identical --------------------

TEST(contract_kernels_match_reference) {
  using namespace hvdtorch;
  using namespace hvdtorch::contract;
  Device& d = contractDevice();
  unsigned seed = 1;
  for (DataType dt : kAllTypes) {
    for (size_t n : {size_t(1), size_t(7), size_t(1000), size_t(4099)}) {
      for (size_t skew : {size_t(0), dtypeSize(dt)}) {
        const auto a = randomBytes(dt, n, seed++);
        const auto b = randomBytes(dt, n, seed++);
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
          std::vector<char> want = a;
          reduceInto(want.data(), b.data(), n, dt, op);
          const auto got = onDevice(d, a, b, skew, [&](void* x, void* y) { d.reduceInto(x, y, n, dt, op, nullptr); });
          CHECK_MSG(got == want, "%s: reduceInto %s %s n=%zu skew=%zu", d.id().str().c_str(), dtypeName(dt),
                    reduceOpName(op), n, skew);
        }
        if (dt == DataType::kBool) continue;
        for (double factor : {0.5, 1.0, 3.0}) {
          std::vector<char> want(b.size());
          copyScaled(want.data(), b.data(), n, dt, factor);
          const auto got =
              onDevice(d, a, b, skew, [&](void* x, void* y) { d.copyScaled(x, y, n, dt, factor, nullptr); });
          CHECK_MSG(got == want, "%s: copyScaled %s n=%zu factor=%g", d.id().str().c_str(), dtypeName(dt), n, factor);
        }
        for (int64_t divisor : {int64_t(1), int64_t(3)}) {
          std::vector<char> want(b.size());
          copyAveraged(want.data(), b.data(), n, dt, divisor, 2.0);
          const auto got =
              onDevice(d, a, b, skew, [&](void* x, void* y) { d.copyAveraged(x, y, n, dt, divisor, 2.0, nullptr); });
          CHECK_MSG(got == want, "%s: copyAveraged %s n=%zu divisor=%lld", d.id().str().c_str(), dtypeName(dt), n,
                    static_cast<long long>(divisor));
        }
        // In place (dst == src), as the executor scales the fusion buffer.
        std::vector<char> want = a;
        copyAveraged(want.data(), want.data(), n, dt, 3, 0.5);
        const auto got = onDevice(d, a, b, skew, [&](void* x, void*) { d.copyAveraged(x, x, n, dt, 3, 0.5, nullptr); });
        CHECK_MSG(got == want, "%s: copyAveraged in place %s n=%zu", d.id().str().c_str(), dtypeName(dt), n);
      }
    }
  }
}

TEST(contract_invalid_arguments_throw_from_the_call) {
  using namespace hvdtorch;
  using namespace hvdtorch::contract;
  Device& d = contractDevice();
  Buffer x(d, 64), y(d, 64);
  CHECK_THROWS(d.reduceInto(x.get(), y.get(), 4, DataType::kFloat32, ReduceOp::kAverage, nullptr), InvalidArgument);
  CHECK_THROWS(d.reduceInto(x.get(), y.get(), 4, DataType::kInt32, ReduceOp::kAdasum, nullptr), InvalidArgument);
  CHECK_THROWS(d.copyScaled(x.get(), y.get(), 4, DataType::kBool, 0.5, nullptr), InvalidArgument);
  CHECK_THROWS(d.copyAveraged(x.get(), y.get(), 4, DataType::kInt32, 0, 1.0, nullptr), InvalidArgument);
  CHECK_THROWS(d.copyAveraged(x.get(), y.get(), 4, DataType::kBool, 2, 1.0, nullptr), InvalidArgument);
  finish(d, nullptr);  // and nothing was left broken on the stream
}

// ---- streams and events -----------------------------------------------------------------

TEST(contract_one_stream_runs_in_order) {
  using namespace hvdtorch;
  using namespace hvdtorch::contract;
  Device& d = contractDevice();
  const size_t n = 4096;
  auto s = d.newStream();
  Buffer x(d, n * 4), y(d, n * 4);
  std::vector<int32_t> ones(n, 1), out(n, -1);
  d.fill(x.get(), n * 4, 0, s.get());
  d.copyFromHost(y.get(), ones.data(), n * 4, s.get());
  for (int k = 0; k < 20; ++k) d.reduceInto(x.get(), y.get(), n, DataType::kInt32, ReduceOp::kSum, s.get());
  d.copyScaled(x.get(), x.get(), n, DataType::kInt32, 2.0, s.get());
  d.copyToHost(out.data(), x.get(), n * 4, s.get());
  finish(d, s.get());
  CHECK(out == std::vector<int32_t>(n, 40));
}

TEST(contract_unrecorded_event_is_complete) {
  using namespace hvdtorch;
  using namespace hvdtorch::contract;
  Device& d = contractDevice();
  auto e = d.newEvent();
  CHECK(d.query(*e));
  d.synchronize(*e);
  auto s = d.newStream();
  d.wait(s.get(), *e);  // must not block the stream
  Buffer x(d, 16);
  d.fill(x.get(), 16, 7, s.get());
  CHECK(toHost(d, x.get(), 16, s.get()) == std::vector<char>(16, 7));
}

// A consumer stream that waits on the producer's event sees the producer's
// data, every time (the event is the only ordering between them).
TEST(contract_wait_orders_two_streams) {
  using namespace hvdtorch;
  using namespace hvdtorch::contract;
  Device& d = contractDevice();
  const size_t n = 1 << 14;
  Buffer x(d, n * 4), y(d, n * 4);
  auto producer = d.newStream();
  auto consumer = d.newStream();
  std::vector<int32_t> ones(n, 1);
  for (int trial = 0; trial < 20; ++trial) {
    d.fill(x.get(), n * 4, 0, producer.get());
    d.copyFromHost(y.get(), ones.data(), n * 4, producer.get());
    for (int k = 0; k < 4; ++k) d.reduceInto(x.get(), y.get(), n, DataType::kInt32, ReduceOp::kSum, producer.get());
    auto ready = d.newEvent();
    d.record(*ready, producer.get());
    d.wait(consumer.get(), *ready);
    std::vector<int32_t> out(n, -1);
    d.copyToHost(out.data(), x.get(), n * 4, consumer.get());
    finish(d, consumer.get());
    CHECK_MSG(out.front() == 4 && out[n / 2] == 4 && out.back() == 4, "trial %d: %d %d %d", trial, out.front(),
              out[n / 2], out.back());
    finish(d, producer.get());  // the next trial's fill must not overtake this trial's copy
  }
}

// A wait binds to the most recent record at the time of the wait call, not
// to a later record of the same event: the producer re-records the event
// only after the consumer's copy (it waits on the consumer's event first).
// Were the consumer's wait bound to the later record, the two streams would
// wait on each other forever (caught by the deadline); were it bound to no
// record, the consumer could copy before the first value was written.
TEST(contract_wait_binds_to_last_record_at_call) {
  using namespace hvdtorch;
  using namespace hvdtorch::contract;
  Device& d = contractDevice();
  Buffer x(d, 4);
  auto producer = d.newStream();
  auto consumer = d.newStream();
  auto e = d.newEvent();
  auto copied = d.newEvent();
  const int32_t one = 1, two = 2;
  int32_t seen = -1;
  d.copyFromHost(x.get(), &one, 4, producer.get());
  d.record(*e, producer.get());
  d.wait(consumer.get(), *e);
  d.copyToHost(&seen, x.get(), 4, consumer.get());
  d.record(*copied, consumer.get());
  d.wait(producer.get(), *copied);
  d.copyFromHost(x.get(), &two, 4, producer.get());
  d.record(*e, producer.get());  // the later record
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!d.query(*e) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!d.query(*e)) {
    std::fprintf(stderr,
                 "contract_wait_binds_to_last_record_at_call: the streams deadlocked (the wait bound to the "
                 "later record)\n");
    std::_Exit(1);  // the streams cannot be destroyed
  }
  d.synchronize(*copied);
  CHECK_MSG(seen == 1, "the consumer saw %d, want 1", seen);
  CHECK(toHost(d, x.get(), 4) == std::vector<char>({2, 0, 0, 0}));
}

// synchronize() makes host memory written by copyToHost readable, the event
// queries complete afterwards, and an event or a stream destroyed with work
// pending does not lose the work.
TEST(contract_synchronize_and_lifetimes) {
  using namespace hvdtorch;
  using namespace hvdtorch::contract;
  Device& d = contractDevice();
  const size_t n = 1 << 16;
  Buffer x(d, n);
  std::vector<char> host(n, 0);
  auto done = d.newEvent();
  {
    auto s = d.newStream();
    d.fill(x.get(), n, 3, s.get());
    {
      auto gone = d.newEvent();
      d.record(*gone, s.get());
      d.wait(nullptr, *gone);  // the engine stream waits, then the event is destroyed
    }
    d.copyToHost(host.data(), x.get(), n, nullptr);
    d.record(*done, nullptr);
  }  // the stream is destroyed with (possibly) work still queued
  d.synchronize(*done);
  CHECK(d.query(*done));
  CHECK(host == std::vector<char>(n, 3));
}

// ---- stream flags (devices with streamFlags()) ------------------------------------

// A flag orders two streams like an event, but the wait may be enqueued
// before the write it waits for (the device ring's streams wait for their
// peers' writes that way).
TEST(contract_flag_orders_two_streams) {
  using namespace hvdtorch;
  using namespace hvdtorch::contract;
  Device& d = contractDevice();
  if (!d.streamFlags()) {
    CHECK_THROWS(d.writeFlag(nullptr, 1, nullptr), CollectiveError);
    std::printf("  (%s has no stream flags: only the refusal checked)\n", d.id().str().c_str());
    return;
  }
  const size_t n = 1 << 14;
  Buffer x(d, n * 4), y(d, n * 4), z(d, n * 4), flag(d, 64);
  d.fill(flag.get(), 64, 0, nullptr);
  finish(d, nullptr);
  auto producer = d.newStream();
  auto consumer = d.newStream();
  std::vector<int32_t> ones(n, 1);
  for (uint32_t trial = 1; trial <= 20; ++trial) {
    // Before the producer's write is even enqueued; device to device, since
    // a copy into pageable host memory returns only once it ran (it would
    // wait here for a write this thread has not enqueued yet).
    d.waitFlag(flag.get(), trial, consumer.get());
    d.copy(z.get(), x.get(), n * 4, consumer.get());
    d.fill(x.get(), n * 4, 0, producer.get());
    d.copyFromHost(y.get(), ones.data(), n * 4, producer.get());
    for (int k = 0; k < 4; ++k) d.reduceInto(x.get(), y.get(), n, DataType::kInt32, ReduceOp::kSum, producer.get());
    d.writeFlag(flag.get(), trial, producer.get());
    std::vector<int32_t> out(n, -1);
    d.copyToHost(out.data(), z.get(), n * 4, consumer.get());
    finish(d, consumer.get());
    CHECK_MSG(out.front() == 4 && out[n / 2] == 4 && out.back() == 4, "trial %u: %d %d %d", trial, out.front(),
              out[n / 2], out.back());
    finish(d, producer.get());
  }
}

// Waits compare modulo 2^32: a counter that wrapped past zero still
// satisfies a wait for a value just below the wrap, a value already passed
// satisfies at once, and a write from a third stream releases a wait nobody
// else would satisfy (DeviceRing::releaseWaits).
TEST(contract_flag_wraps_and_releases) {
  using namespace hvdtorch;
  using namespace hvdtorch::contract;
  Device& d = contractDevice();
  if (!d.streamFlags()) return;
  Buffer flag(d, 64), x(d, 4), y(d, 4);
  auto waiter = d.newStream();
  auto releaser = d.newStream();
  d.writeFlag(flag.get(), 0xfffffff0u, nullptr);
  finish(d, nullptr);
  d.waitFlag(flag.get(), 0xffffffe0u, waiter.get());  // already passed
  finish(d, waiter.get());
  d.writeFlag(flag.get(), 0x10u, nullptr);  // wrapped: 0x20 past 0xfffffff0
  finish(d, nullptr);
  d.waitFlag(flag.get(), 0xfffffffeu, waiter.get());
  d.waitFlag(flag.get(), 0x10u, waiter.get());
  finish(d, waiter.get());
  // A wait for 0x1000 that only a far-ahead write from another stream releases.
  const int32_t seven = 7;
  int32_t seen = -1;
  d.waitFlag(flag.get(), 0x1000u, waiter.get());
  d.copy(y.get(), x.get(), 4, waiter.get());  // device to device: the call must not block (see above)
  auto copied = d.newEvent();
  d.record(*copied, waiter.get());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_MSG(!d.query(*copied), "a wait for a value never written passed");
  d.copyFromHost(x.get(), &seven, 4, releaser.get());
  d.writeFlag(flag.get(), 0x10u + (1u << 30), releaser.get());
  d.synchronize(*copied);
  d.copyToHost(&seen, y.get(), 4, waiter.get());
  finish(d, waiter.get());
  CHECK_MSG(seen == 7, "the released stream saw %d, want 7", seen);
}
