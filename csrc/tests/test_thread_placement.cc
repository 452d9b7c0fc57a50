// Where the engine's threads run (common/thread_placement.h): the rule of
// HVDTORCH_THREAD_AFFINITY, and a thread really placed by it.
#include <pthread.h>
#include <sched.h>

#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "common/thread_placement.h"

using namespace hvdtorch;

namespace {
using Cpus = std::vector<int>;
}  // namespace

TEST(auto_gives_each_local_rank_its_slice_of_an_unplaced_machine) {
  const Cpus all = {0, 1, 2, 3, 4, 5, 6, 7};
  CHECK((engineThreadCpus("auto", all, 8, 0, 2) == Cpus{0, 1, 2, 3}));
  CHECK((engineThreadCpus("auto", all, 8, 1, 2) == Cpus{4, 5, 6, 7}));
  CHECK((engineThreadCpus("auto", all, 8, 2, 3) == Cpus{4, 5}));  // 8 / 3: two each, CPUs 6-7 unused
  CHECK((engineThreadCpus("auto", {0, 1}, 2, 1, 2) == Cpus{1}));
}

TEST(auto_leaves_a_placed_process_or_an_oversubscribed_host_alone) {
  // mpirun bound the process to one core (or taskset, or a container's cpuset).
  CHECK(engineThreadCpus("auto", {3}, 8, 1, 2).empty());
  CHECK(engineThreadCpus("auto", {0, 1, 2, 3}, 8, 0, 2).empty());
  // More ranks on this host than CPUs: pinning would stack ranks on a core.
  CHECK(engineThreadCpus("auto", {0, 1}, 2, 2, 4).empty());
  CHECK(engineThreadCpus("off", {0, 1, 2, 3}, 4, 0, 2).empty());
}

TEST(a_list_gives_local_rank_i_the_ith_cpu) {
  CHECK((engineThreadCpus("3,1", {0, 1, 2, 3}, 4, 0, 2) == Cpus{3}));
  CHECK((engineThreadCpus("3,1", {0, 1, 2, 3}, 4, 1, 2) == Cpus{1}));
  // A list is the user's word: it applies even where auto would not pin.
  CHECK((engineThreadCpus("1,1", {1}, 4, 0, 2) == Cpus{1}));
  CHECK((engineThreadCpus("2,3", {2, 3}, 4, 0, 2) == Cpus{2}));
}

TEST(a_bad_list_is_refused_naming_the_knob) {
  CHECK_THROWS(engineThreadCpus("0,x", {0, 1}, 2, 0, 2), InvalidArgument);
  CHECK_THROWS(engineThreadCpus("0,", {0, 1}, 2, 0, 2), InvalidArgument);
  CHECK_THROWS(engineThreadCpus("-1,0", {0, 1}, 2, 0, 2), InvalidArgument);
  CHECK_THROWS(engineThreadCpus("0", {0, 1}, 2, 0, 2), InvalidArgument);    // one CPU for two local ranks
  CHECK_THROWS(engineThreadCpus("0,5", {0, 1}, 2, 1, 2), InvalidArgument);  // CPU 5 is not ours
  CHECK_THROWS(engineThreadCpus("0,5", {0, 1}, 2, 0, 2), InvalidArgument);  // nor for local rank 0
  CHECK_THROWS(engineThreadCpus("sometimes", {0, 1}, 2, 0, 2), InvalidArgument);
  bool thrown = false;
  try {
    engineThreadCpus("0,1,2", {0, 1, 2, 3}, 4, 0, 2);
  } catch (const InvalidArgument& e) {
    thrown = true;
    const std::string what = e.what();
    CHECK_MSG(what.find("HVDTORCH_THREAD_AFFINITY") != std::string::npos && what.find("2 ranks") != std::string::npos,
              "unclear error: %s", what.c_str());
  }
  CHECK(thrown);
}

TEST(an_engine_thread_takes_the_set_and_its_name) {
  const Cpus allowed = allowedCpus();
  CHECK(!allowed.empty());
  const int cpu = allowed.back();
  setEngineThreadCpus({cpu});
  Cpus seen;
  char name[16] = {};
  std::thread t([&] {
    placeEngineThread("hvd-test-thread-long-name");
    seen = allowedCpus();
    pthread_getname_np(pthread_self(), name, sizeof(name));
  });
  t.join();
  CHECK((seen == Cpus{cpu}));
  CHECK(std::string(name) == "hvd-test-thread");  // the kernel keeps 15 characters
  setEngineThreadCpus({});
  std::thread u([&] {
    placeEngineThread("hvd-test");
    seen = allowedCpus();
  });
  u.join();
  CHECK(seen == allowed);  // an empty set leaves the thread where it was
}

HVD_TEST_MAIN()
