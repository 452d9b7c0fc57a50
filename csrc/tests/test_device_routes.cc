// The device route model behind reducer `auto` on device tensors
// (algorithms/device_routes.h): its estimates between, below and above the
// probe sizes, and the choice, which leaves the rule's route only for a
// measured, clear win. Times are fed in directly, so the expected choices do
// not depend on this machine.
#include <cmath>

#include "algorithms/device_routes.h"
#include "check.h"
#include "common/error.h"

using namespace hvdtorch;

namespace {

constexpr double kMs = 1e-3;
constexpr size_t kKiB = 1024;
constexpr DeviceRouteMask kAll = {true, true, true};

bool near(double a, double b) { return std::fabs(a - b) <= 1e-12 + 1e-9 * std::fabs(b); }

// Probes at 64 KiB, 1 MiB and 16 MiB. Native: latency 0.05 ms, then 10 GB/s;
// ring: 0.5 ms at every small size but faster for large ones; staged slow.
DeviceRouteModel threeRoutes() {
  return DeviceRouteModel(
      {64 * kKiB, 1024 * kKiB, 16384 * kKiB},
      {std::vector<double>{0.05 * kMs, 0.2 * kMs, 2.0 * kMs}, std::vector<double>{0.5 * kMs, 0.6 * kMs, 1.0 * kMs},
       std::vector<double>{0.3 * kMs, 1.0 * kMs, 9.0 * kMs}});
}

}  // namespace

TEST(estimates_interpolate_hold_below_and_scale_above) {
  const DeviceRouteModel m = threeRoutes();
  CHECK(near(m.estimate(DeviceRoute::kNative, 64 * kKiB), 0.05 * kMs));
  CHECK(near(m.estimate(DeviceRoute::kNative, 1 * kKiB), 0.05 * kMs));  // latency-bound below the smallest probe
  // Halfway between the first two probes.
  CHECK(near(m.estimate(DeviceRoute::kNative, (64 + 1024) * kKiB / 2), 0.125 * kMs));
  CHECK(near(m.estimate(DeviceRoute::kRing, 16384 * kKiB), 1.0 * kMs));
  CHECK(near(m.estimate(DeviceRoute::kRing, 65536 * kKiB), 4.0 * kMs));  // bandwidth-bound above the largest
}

TEST(an_unmeasured_route_is_never_chosen) {
  const DeviceRouteModel m({4 * kKiB, 64 * kKiB},
                           {std::vector<double>{1 * kMs, 2 * kMs}, std::vector<double>{}, std::vector<double>{}});
  CHECK(m.estimate(DeviceRoute::kRing, 4 * kKiB) < 0);
  CHECK(m.choose(64 * kKiB, kAll, DeviceRoute::kNative) == DeviceRoute::kNative);
  // The rule's route unmeasured: nothing to compare with, the rule stands.
  CHECK(m.choose(64 * kKiB, kAll, DeviceRoute::kStaged) == DeviceRoute::kStaged);
}

TEST(the_rule_stands_unless_another_route_is_clearly_faster) {
  const DeviceRouteModel m = threeRoutes();
  // Small: native is the fastest and the rule.
  CHECK(m.choose(64 * kKiB, kAll, DeviceRoute::kNative) == DeviceRoute::kNative);
  // Large: the ring takes half native's time: a clear win.
  CHECK(m.choose(16384 * kKiB, kAll, DeviceRoute::kNative) == DeviceRoute::kRing);
  CHECK(m.choose(256 * 1024 * kKiB, kAll, DeviceRoute::kNative) == DeviceRoute::kRing);
  // Where the ring is the rule, small ops move to native (10x faster).
  CHECK(m.choose(64 * kKiB, kAll, DeviceRoute::kRing) == DeviceRoute::kNative);
  // A route that does not serve the op is not taken, however fast.
  CHECK(m.choose(16384 * kKiB, {true, false, true}, DeviceRoute::kNative) == DeviceRoute::kNative);
  CHECK(m.choose(64 * kKiB, {false, true, true}, DeviceRoute::kRing) == DeviceRoute::kStaged);
}

TEST(near_ties_and_tiny_gains_keep_the_rule) {
  // Ring 15% faster than native everywhere: inside the margin.
  const DeviceRouteModel close(
      {64 * kKiB, 16384 * kKiB},
      {std::vector<double>{1.0 * kMs, 10 * kMs}, std::vector<double>{0.85 * kMs, 8.5 * kMs}, std::vector<double>{}});
  CHECK(close.choose(64 * kKiB, kAll, DeviceRoute::kNative) == DeviceRoute::kNative);
  CHECK(close.choose(16384 * kKiB, kAll, DeviceRoute::kNative) == DeviceRoute::kNative);
  // Staged half native's time, but 20 us saved: below kMinGainSeconds.
  const DeviceRouteModel tiny({4 * kKiB},
                              {std::vector<double>{40e-6}, std::vector<double>{}, std::vector<double>{20e-6}});
  CHECK(tiny.choose(4 * kKiB, kAll, DeviceRoute::kNative) == DeviceRoute::kNative);
}

TEST(bad_probes_are_refused) {
  using Times = std::array<std::vector<double>, kDeviceRoutes>;
  CHECK_THROWS(DeviceRouteModel({}, Times{}), InvalidArgument);
  CHECK_THROWS(DeviceRouteModel({64, 4}, Times{}), InvalidArgument);
  CHECK_THROWS(DeviceRouteModel({4, 64}, Times{std::vector<double>{1.0}, {}, {}}), InvalidArgument);
}

TEST(the_description_names_each_measured_route) {
  const std::string d = threeRoutes().describe();
  CHECK_MSG(d.find("64 KiB") != std::string::npos && d.find("16 MiB") != std::string::npos, "%s", d.c_str());
  CHECK_MSG(d.find("native") != std::string::npos && d.find("ring") != std::string::npos &&
                d.find("staged") != std::string::npos,
            "%s", d.c_str());
}

HVD_TEST_MAIN()
