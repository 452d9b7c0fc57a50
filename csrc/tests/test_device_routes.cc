// The device route model behind reducer `auto` on device tensors
// (algorithms/device_routes.h): its estimates between, below and above the
// probe sizes, and the choice, which leaves the rule's route only for a
// measured, clear win and stages through the host reducer measured fastest.
// Times are fed in directly, so the expected choices do not depend on this
// machine.
#include <cmath>

#include "algorithms/device_routes.h"
#include "algorithms/reducer_registry.h"
#include "check.h"
#include "common/error.h"

using namespace hvdtorch;

namespace {

constexpr double kMs = 1e-3;
constexpr size_t kKiB = 1024;
const DeviceWay kNative{DeviceRoute::kNative, kAutoReducer};
const DeviceWay kRing{DeviceRoute::kRing, kAutoReducer};

DeviceWay staged(const char* reducer) { return {DeviceRoute::kStaged, parseReducer(reducer)}; }

bool all(const DeviceWay&) { return true; }

bool near(double a, double b) { return std::fabs(a - b) <= 1e-12 + 1e-9 * std::fabs(b); }

// Probes at 64 KiB, 1 MiB and 16 MiB. Native: latency 0.05 ms, then 10 GB/s;
// ring: 0.5 ms at every small size but faster for large ones; staged slow
// through the ring reducer, slower through central.
DeviceRouteModel threeRoutes() {
  return DeviceRouteModel({64 * kKiB, 1024 * kKiB, 16384 * kKiB},
                          {{kNative, {0.05 * kMs, 0.2 * kMs, 2.0 * kMs}},
                           {kRing, {0.5 * kMs, 0.6 * kMs, 1.0 * kMs}},
                           {staged("ring"), {0.3 * kMs, 1.0 * kMs, 9.0 * kMs}},
                           {staged("central"), {0.6 * kMs, 2.0 * kMs, 18.0 * kMs}}});
}

}  // namespace

TEST(estimates_interpolate_hold_below_and_scale_above) {
  const DeviceRouteModel m = threeRoutes();
  CHECK(near(m.estimate(kNative, 64 * kKiB), 0.05 * kMs));
  CHECK(near(m.estimate(kNative, 1 * kKiB), 0.05 * kMs));  // latency-bound below the smallest probe
  // Halfway between the first two probes.
  CHECK(near(m.estimate(kNative, (64 + 1024) * kKiB / 2), 0.125 * kMs));
  CHECK(near(m.estimate(kRing, 16384 * kKiB), 1.0 * kMs));
  CHECK(near(m.estimate(kRing, 65536 * kKiB), 4.0 * kMs));  // bandwidth-bound above the largest
  CHECK(near(m.estimate(staged("central"), 1024 * kKiB), 2.0 * kMs));
  CHECK(m.estimate(staged("node"), 1024 * kKiB) < 0);  // never timed
}

TEST(an_unmeasured_way_is_never_chosen) {
  const DeviceRouteModel m({4 * kKiB, 64 * kKiB}, {{kNative, {1 * kMs, 2 * kMs}}, {kRing, {-1.0, -1.0}}});
  CHECK(m.estimate(kRing, 4 * kKiB) < 0);
  CHECK(m.choose(64 * kKiB, all, DeviceRoute::kNative) == kNative);
  // The rule's route unmeasured: nothing to compare with, the rule stands
  // (staging through the host cost model's pick).
  CHECK((m.choose(64 * kKiB, all, DeviceRoute::kStaged) == DeviceWay{DeviceRoute::kStaged, kAutoReducer}));
  CHECK((m.choose(64 * kKiB, all, DeviceRoute::kRing) == kRing));
}

TEST(the_rule_stands_unless_another_way_is_clearly_faster) {
  const DeviceRouteModel m = threeRoutes();
  // Small: native is the fastest and the rule.
  CHECK(m.choose(64 * kKiB, all, DeviceRoute::kNative) == kNative);
  // Large: the ring takes half native's time: a clear win.
  CHECK(m.choose(16384 * kKiB, all, DeviceRoute::kNative) == kRing);
  CHECK(m.choose(256 * 1024 * kKiB, all, DeviceRoute::kNative) == kRing);
  // Where the ring is the rule, small ops move to native (10x faster).
  CHECK(m.choose(64 * kKiB, all, DeviceRoute::kRing) == kNative);
  // A way that does not serve the op is not taken, however fast.
  const auto no_ring = [](const DeviceWay& w) { return w.route != DeviceRoute::kRing; };
  CHECK(m.choose(16384 * kKiB, no_ring, DeviceRoute::kNative) == kNative);
  const auto no_native = [](const DeviceWay& w) { return w.route != DeviceRoute::kNative; };
  CHECK(m.choose(64 * kKiB, no_native, DeviceRoute::kRing) == staged("ring"));
}

TEST(staging_goes_through_the_host_reducer_measured_fastest) {
  // Staged is the rule (across hosts, no device group): the incumbent is
  // staging's fastest way, with no margin between host reducers.
  const DeviceRouteModel m({4 * kKiB, 4096 * kKiB}, {{staged("ring"), {0.30 * kMs, 4.0 * kMs}},
                                                     {staged("central"), {0.10 * kMs, 4.2 * kMs}},
                                                     {kRing, {0.50 * kMs, 40.0 * kMs}}});
  CHECK(m.choose(4 * kKiB, all, DeviceRoute::kStaged) == staged("central"));
  CHECK(m.choose(4096 * kKiB, all, DeviceRoute::kStaged) == staged("ring"));  // 5% apart: the faster, no margin
  // A staged way whose reducer does not serve the op is left out.
  const auto no_central = [](const DeviceWay& w) { return !(w == staged("central")); };
  CHECK(m.choose(4 * kKiB, no_central, DeviceRoute::kStaged) == staged("ring"));
  // The device ring as the rule loses to staging through central at 4 KiB (5x).
  CHECK(m.choose(4 * kKiB, all, DeviceRoute::kRing) == staged("central"));
}

TEST(near_ties_and_tiny_gains_keep_the_rule_and_nothing_beyond_the_margin_does) {
  // Ring 5% faster than native everywhere: inside the margin.
  const DeviceRouteModel close({64 * kKiB, 16384 * kKiB},
                               {{kNative, {1.0 * kMs, 10 * kMs}}, {kRing, {0.95 * kMs, 9.5 * kMs}}});
  CHECK(close.choose(64 * kKiB, all, DeviceRoute::kNative) == kNative);
  CHECK(close.choose(16384 * kKiB, all, DeviceRoute::kNative) == kNative);
  // 10% faster: beyond the margin, so `auto` stays within 10% of the fastest.
  const DeviceRouteModel ten({64 * kKiB}, {{kNative, {1.0 * kMs}}, {kRing, {0.9 * kMs}}});
  CHECK(ten.choose(64 * kKiB, all, DeviceRoute::kNative) == kRing);
  // Half native's time at 4 KiB, 20 us saved: a clear win however small the op.
  const DeviceRouteModel small({4 * kKiB}, {{kNative, {40e-6}}, {staged("ring"), {20e-6}}});
  CHECK(small.choose(4 * kKiB, all, DeviceRoute::kNative) == staged("ring"));
  // 1.5 us saved: below kMinGainSeconds, timing noise at this size.
  const DeviceRouteModel tiny({4 * kKiB}, {{kNative, {5.0e-6}}, {staged("ring"), {3.5e-6}}});
  CHECK(tiny.choose(4 * kKiB, all, DeviceRoute::kNative) == kNative);
}

TEST(bad_probes_are_refused) {
  CHECK_THROWS(DeviceRouteModel({}, {}), InvalidArgument);
  CHECK_THROWS(DeviceRouteModel({64, 4}, {}), InvalidArgument);
  CHECK_THROWS(DeviceRouteModel({4, 64}, {{kNative, {1.0}}}), InvalidArgument);
}

TEST(the_description_names_each_measured_way) {
  const std::string d = threeRoutes().describe();
  CHECK_MSG(d.find("64 KiB") != std::string::npos && d.find("16 MiB") != std::string::npos, "%s", d.c_str());
  CHECK_MSG(d.find("native") != std::string::npos && d.find("ring") != std::string::npos &&
                d.find("staged:ring") != std::string::npos && d.find("staged:central") != std::string::npos,
            "%s", d.c_str());
}

HVD_TEST_MAIN()
