// The engine's short path for small ops (execution/work_queue.h): a small unit runs on the
// control thread when the executor is idle, a large one on the executor.
// Mixing the two, with ranks that see the executor busy at different times,
// must keep every rank's units in the same order (otherwise two threads use
// the data links at once, or ops meet the wrong peers: wrong sums, hangs);
// and every op waited for leaves its hand-off phases in the latency log.
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "cluster.h"
#include "engine/engine.h"
#include "submit.h"
#include "transport/shm/wait.h"

using namespace hvdtorch;
using hvdtorch::test::Cluster;
using hvdtorch::test::finish;
using hvdtorch::test::floats;
using hvdtorch::test::sumOf;
using hvdtorch::test::valuesOf;

namespace {

constexpr size_t kLargeFloats = 2 << 20;  // 8 MiB: far above the inline limit, long to run
constexpr size_t kSmallFloats = 1 << 10;  // 4 KiB: below it

Config unfused() {
  Config cfg;
  cfg.fusion_threshold = 0;  // every tensor its own unit
  return cfg;
}

}  // namespace

TEST(small_units_keep_their_place_behind_large_ones) {
  const int p = 2, steps = 30;
  Cluster c(p, unfused());
  c.onEveryRank([&](int r, Engine& eng) {
    for (int i = 0; i < steps; ++i) {
      auto large = floats(std::vector<float>(kLargeFloats, float(r + 1 + i)));
      auto small = floats(std::vector<float>(kSmallFloats, float(10 * (r + 1) + i)));
      const int64_t hl = sumOf(eng, "large" + std::to_string(i), large);
      // Every third step, rank 0 (then rank 1, then neither) submits the
      // small op only once the large one is done (its executor idle: the
      // small unit runs inline); the others right away, so that they may
      // find the large unit still queued or running.
      const bool after_large = r == i % 3;
      std::string err_large;
      if (after_large) err_large = finish(eng, hl, std::chrono::seconds(10));
      const int64_t hs = sumOf(eng, "small" + std::to_string(i), small);
      if (!after_large) err_large = finish(eng, hl, std::chrono::seconds(10));
      const std::string err_small = finish(eng, hs, std::chrono::seconds(10));
      CHECK_MSG(err_large.empty(), "rank %d step %d: %s", r, i, err_large.c_str());
      CHECK_MSG(err_small.empty(), "rank %d step %d: %s", r, i, err_small.c_str());
      if (!err_large.empty() || !err_small.empty()) return;
      CHECK(valuesOf(large)[kLargeFloats - 1] == float(3 + 2 * i));
      CHECK(valuesOf(small)[kSmallFloats - 1] == float(30 + 2 * i));
    }
  });
}

TEST(a_barrier_between_small_ops_runs_in_order) {
  const int p = 3, steps = 20;
  Cluster c(p, unfused());
  c.onEveryRank([&](int r, Engine& eng) {
    for (int i = 0; i < steps; ++i) {
      auto t = floats(std::vector<float>(kSmallFloats, float(r)));
      const int64_t h = sumOf(eng, "before" + std::to_string(i), t);
      auto e = std::make_shared<Entry>();
      e->request.type = OpType::kBarrier;
      e->request.name = "barrier" + std::to_string(i);
      const int64_t hb = eng.submit(e);
      if (r == i % p) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a late rank
      const std::string err = finish(eng, h, std::chrono::seconds(10));
      const std::string err_b = finish(eng, hb, std::chrono::seconds(10));
      CHECK_MSG(err.empty() && err_b.empty(), "rank %d step %d: %s%s", r, i, err.c_str(), err_b.c_str());
      if (!err.empty() || !err_b.empty()) return;
      CHECK(valuesOf(t)[0] == float(0 + 1 + 2));
    }
  });
}

TEST(a_waited_op_leaves_its_phases_in_the_latency_log) {
  const int p = 2;
  Cluster c(p);
  c.onEveryRank([&](int r, Engine& eng) {
    eng.latencyLog().clear();
    auto t = floats(std::vector<float>(kSmallFloats, 1.0f));
    const std::string err = finish(eng, sumOf(eng, "logged", t), std::chrono::seconds(10));
    CHECK_MSG(err.empty(), "rank %d: %s", r, err.c_str());
    const std::vector<OpPhases> log = eng.latencyLog().snapshot();
    CHECK(log.size() == 1);
    if (log.size() != 1) return;
    const OpPhases& ph = log[0];
    // Stamped by the engine: every phase from the submit to completion.
    CHECK(ph.control_wake >= 0);
    CHECK(ph.negotiate >= 0);
    CHECK(ph.executor_wake >= 0);
    CHECK(ph.copy_in >= 0);
    CHECK(ph.reduce >= 0);
    CHECK(ph.finish >= 0);
    // Stamped by the binding only (this op did not come through it).
    CHECK(ph.binding == -1);
    CHECK(ph.waiter_wake == -1);
  });
}

TEST(the_latency_log_keeps_the_newest_ops) {
  LatencyLog log;
  OpTimes t;
  t.submitted = OpTimes::Clock::time_point(std::chrono::nanoseconds(1));
  for (size_t i = 0; i < LatencyLog::kCapacity + 5; ++i) {
    t.picked = t.submitted + std::chrono::nanoseconds(i);
    log.add(t);
  }
  const std::vector<OpPhases> got = log.snapshot();
  CHECK(got.size() == LatencyLog::kCapacity);
  CHECK(got.front().control_wake == 5);  // the 5 oldest were overwritten
  CHECK(got.back().control_wake == static_cast<int64_t>(LatencyLog::kCapacity + 4));
  CHECK(got.back().negotiate == -1);  // never stamped
}

TEST(the_engine_spins_only_when_every_local_rank_has_a_core) {
  const unsigned cores = std::thread::hardware_concurrency();
  {
    Cluster c(2);
    CHECK(shmSpinBudget().count() == (cores >= 2 ? 20 : 0));
  }
  {
    Cluster c(static_cast<int>(cores) + 1);
    CHECK(shmSpinBudget().count() == 0);
  }
}

HVD_TEST_MAIN()
