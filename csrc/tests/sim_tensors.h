// Tensors on a simulated device as a framework hands them to the engine:
// written from host values on the caller's own stream, with a ready event
// recorded there (the engine's stream must wait on it), and read back on
// that stream after waiting on the op's completion event. A missing wait on
// either side shows as stale values: the device's streams run with random
// delays (sim_device.h).
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "device/devices.h"
#include "device/sim_device.h"
#include "engine/execution/device_tensor.h"
#include "engine/op_state.h"

namespace hvdtorch::test {

class CallerTensor : public DeviceTensor {
 public:
  CallerTensor(Device& dev, DataType dtype, std::vector<int64_t> shape)
      : DeviceTensor(dev, dtype, std::move(shape), false) {}
  // The upload reads `host`: it must have run before `host` goes.
  ~CallerTensor() override {
    if (ready_) device_of_.synchronize(*ready_);
    if (registered_) device_of_.unregisterHost(host.data());
  }
  std::shared_ptr<Event> ready() const override { return ready_; }
  Device& device_of_ = deviceFor(device());
  std::shared_ptr<Event> ready_;
  std::vector<char> host;    // the values being uploaded; kept until the copy ran
  bool registered_ = false;  // `host` registered with the device (a late upload)
};

// One rank's side of the framework: its device and its "current stream".
struct Caller {
  explicit Caller(DeviceId id) : dev(deviceFor(id)), stream(dev.newStream()) {}

  // A device tensor holding `host` (raw bytes of dtype), ready on the caller's
  // stream. `late`: the caller's stream first runs long work (fills of a
  // scratch buffer, tens of milliseconds), so the values land well after the
  // op is submitted and negotiated: only a wait on the ready event sees them.
  std::shared_ptr<CallerTensor> upload(DataType dtype, std::vector<int64_t> shape, std::vector<char> host,
                                       bool late = false) {
    auto t = std::make_shared<CallerTensor>(dev, dtype, std::move(shape));
    t->host = std::move(host);
    if (late) {
      // From registered memory, as a framework's pinned upload: a copy from
      // pageable memory makes the host wait for the stream's earlier work
      // (CUDA's rule, which the simulated device keeps), which would sit out
      // the stall here, before the op is even submitted.
      dev.registerHost(t->host.data(), t->bytes());
      t->registered_ = true;
      stall(8);
    }
    dev.copyFromHost(t->data(), t->host.data(), t->bytes(), stream.get());
    t->ready_ = dev.newEvent();
    dev.record(*t->ready_, stream.get());
    return t;
  }

  // Long work on the caller's stream: `fills` fills of a scratch buffer
  // (each a few milliseconds). Not zeroed first: a zeroing fill on the
  // engine stream would race with these fills on the caller's.
  void stall(int fills) {
    if (dev.id().kind == DeviceKind::kSim) {
      // A sleep on the stream: fills would keep the engine threads off the
      // CPU as long as they run, and the op would find its inputs landed.
      simStall(dev, stream.get(), 2 * fills);
      return;
    }
    if (!scratch)
      scratch = std::make_shared<DeviceTensor>(dev, DataType::kUInt8, std::vector<int64_t>{kScratch}, false);
    for (int i = 0; i < fills; ++i) dev.fill(scratch->data(), kScratch, static_cast<uint8_t>(i), stream.get());
  }

  // The bytes of `t` once the op of `state` completed, read on the caller's stream.
  std::vector<char> download(const OpState& state, TensorBuffer& t) {
    if (state.completion) dev.wait(stream.get(), *state.completion);
    std::vector<char> out(t.bytes());
    dev.copyToHost(out.data(), t.data(), t.bytes(), stream.get());
    auto done = dev.newEvent();
    dev.record(*done, stream.get());
    dev.synchronize(*done);
    return out;
  }

  static constexpr int64_t kScratch = 16 << 20;
  Device& dev;
  std::unique_ptr<Stream> stream;
  std::shared_ptr<DeviceTensor> scratch;
};

}  // namespace hvdtorch::test
