// The Device contract (device_contract.h) on the simulated device, with its
// random stream delays (seed from HVDTORCH_SIM_SEED, printed so that a
// failure reproduces), run twice: with memory in memfd mappings, and in
// interprocess mode, where memory lives in named shared memory.
#include <cstdio>
#include <memory>

#include "device/sim_device.h"
#include "device_contract.h"

namespace {
std::unique_ptr<hvdtorch::Device> current;
}

hvdtorch::Device& hvdtorch::contract::contractDevice() { return *current; }

int main() {
  using namespace hvdtorch;
  for (bool interprocess : {false, true}) {
    SimOptions o = SimOptions::fromEnv();
    o.interprocess = interprocess;
    std::printf(
        "sim device: seed %llu, delays up to %d us, interprocess %d (HVDTORCH_SIM_SEED and "
        "HVDTORCH_SIM_MAX_DELAY_US reproduce a run)\n",
        static_cast<unsigned long long>(o.seed), o.max_delay_us, int(o.interprocess));
    current = makeSimDevice(o);
    for (auto& c : test::registry()) {
      const int before = test::failures();
      try {
        c.fn();
      } catch (const std::exception& e) {
        ++test::failures();
        std::fprintf(stderr, "%s: uncaught exception: %s\n", c.name, e.what());
      }
      std::printf("[%s] %s\n", test::failures() == before ? "PASS" : "FAIL", c.name);
    }
    current.reset();
  }
  return test::failures() == 0 ? 0 : 1;
}
