// Config (config/config.h): the knobs of the simulated device, the ones read
// from the environment only, the REDUCER knob's help, which names the
// reducers by hand because config sits below algorithms/ (the registry), and
// the cycle time in milliseconds.
#include <chrono>
#include <cstdlib>
#include <string>

#include "algorithms/reducer_registry.h"
#include "check.h"
#include "common/error.h"
#include "config/config.h"

using namespace hvdtorch;

namespace {

const Config::Knob& knob(const std::string& name) {
  for (const auto& k : Config::knobs())
    if (k.name == name) return k;
  throw InvalidArgument("no knob " + name);
}

}  // namespace

TEST(reducer_help_names_every_registered_reducer) {
  const std::string& help = knob("REDUCER").help;
  CHECK(help.find("auto") != std::string::npos);
  for (const ReducerEntry& r : reducerRegistry())
    CHECK_MSG(help.find(r.name) != std::string::npos, "HVDTORCH_REDUCER's help does not name %s", r.name);
}

TEST(sim_knobs_parse_as_the_simulated_device_did) {
  Config c;
  c.set("SIM_SEED", "1234");
  c.set("sim_max_delay_us", "0");
  c.set("HVDTORCH_SIM_INTERPROCESS", "1");
  c.set("SIM_HOST_COPY_US", "7");
  c.set("SIM_KERNEL_US", "9");
  c.set("SIM_DEVICE", "1");
  CHECK(c.sim_seed == 1234 && c.sim_max_delay_us == 0 && c.sim_interprocess && c.sim_host_copy_us == 7 &&
        c.sim_kernel_us == 9 && c.sim_device);
  c.set("SIM_DEVICE", "0");
  CHECK(!c.sim_device);
  CHECK_THROWS(c.set("SIM_SEED", "12x"), InvalidArgument);
  CHECK_THROWS(c.set("SIM_SEED", "1.5"), InvalidArgument);
  CHECK_THROWS(c.set("SIM_SEED", "-1"), InvalidArgument);
  CHECK_THROWS(c.set("SIM_INTERPROCESS", "2"), InvalidArgument);
  CHECK_THROWS(c.set("SIM_MAX_DELAY_US", "1000001"), InvalidArgument);
  CHECK_THROWS(c.set("SIM_DEVICE", "yes"), InvalidArgument);
}

TEST(environment_only_knobs_are_refused_as_options) {
  CHECK(knob("SIM_SEED").environment_only && !knob("TIMEOUT").environment_only);
  CHECK_THROWS(Config::load({{"sim_seed", "3"}}), InvalidArgument);
  CHECK(Config::load({{"timeout", "3"}}).timeout.count() == 3000);
}

TEST(load_from_environment_reads_only_the_named_knobs) {
  setenv("HVDTORCH_SIM_SEED", "77", 1);
  setenv("HVDTORCH_TIMEOUT", "not a number", 1);
  const Config c = Config::loadFromEnvironment({"SIM_SEED"});
  CHECK(c.sim_seed == 77 && c.timeout == Config().timeout);
  CHECK_THROWS(Config::load(), InvalidArgument);
  unsetenv("HVDTORCH_TIMEOUT");
  unsetenv("HVDTORCH_SIM_SEED");
}

TEST(the_cycle_time_is_read_in_milliseconds) {
  // HVDTORCH_CYCLE_TIME is milliseconds (the default, 1, is 1 ms): read as
  // microseconds, a negotiation cycle would run 1000 times too often.
  using std::chrono::microseconds;
  CHECK(Config().cycle_time == microseconds(1000));
  CHECK(knob("CYCLE_TIME").default_value == "1");
  Config c;
  c.set("CYCLE_TIME", "20");
  CHECK_MSG(c.cycle_time == microseconds(20000), "20 ms read as %lld us", static_cast<long long>(c.cycle_time.count()));
  c.set("cycle_time", "0.25");
  CHECK_MSG(c.cycle_time == microseconds(250), "0.25 ms read as %lld us", static_cast<long long>(c.cycle_time.count()));
  setenv("HVDTORCH_CYCLE_TIME", "5", 1);
  CHECK(Config::load().cycle_time == microseconds(5000));
  CHECK(Config::load({{"cycle_time", "7"}}).cycle_time == microseconds(7000));  // an option wins over the variable
  unsetenv("HVDTORCH_CYCLE_TIME");
  CHECK_THROWS(c.set("CYCLE_TIME", "-1"), InvalidArgument);
}

HVD_TEST_MAIN()
