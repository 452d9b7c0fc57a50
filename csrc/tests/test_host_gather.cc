// The host's shared gathered buckets (transport/shm/host_gather.h), with one
// thread per local rank, each mapping the segments itself as a process
// would: every gather holds every rank's shard, a later gather never writes
// under a rank still reading the last one, slots are reused (the host holds
// as many as buckets in use at once), waits name the ranks they wait for
// (a put the ranks still holding the last gather, not those that released
// it; a dead peer by its rank, not the waiter), misuse is refused, and
// nothing is left in /dev/shm.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "shm_entries.h"
#include "transport/shm/host_gather.h"

using namespace hvdtorch;
using hvdtorch::test::shmEntries;
using hvdtorch::test::uniqueShmPrefix;

namespace {

constexpr auto kTimeout = std::chrono::milliseconds(20000);

// Runs body(party) on one thread per party and waits for all.
void onParties(int parties, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int p = 0; p < parties; ++p) threads.emplace_back(body, p);
  for (auto& t : threads) t.join();
}

// A barrier of the test's own threads (not the code under test).
struct ThreadBarrier {
  explicit ThreadBarrier(int n) : n(n) {}
  void arrive() {
    const int round = rounds.load();
    if (count.fetch_add(1) + 1 == n) {
      count = 0;
      rounds.fetch_add(1);
    } else {
      while (rounds.load() == round) std::this_thread::yield();
    }
  }
  int n;
  std::atomic<int> count{0};
  std::atomic<int> rounds{0};
};

// Party p's bytes of a bucket of `bytes` bytes among `parties`: an uneven split, the last part the largest.
std::pair<size_t, size_t> rangeOf(int p, int parties, size_t bytes) {
  const size_t part = bytes / parties;
  return {part * p, p == parties - 1 ? bytes : part * (p + 1)};
}

uint8_t valueAt(size_t byte, uint64_t gen) { return static_cast<uint8_t>(1 + (byte * 7 + gen * 13) % 251); }

}  // namespace

TEST(every_gather_holds_every_shard_and_slots_are_reused) {
  const std::string name = uniqueShmPrefix("hg");
  const std::vector<size_t> sizes = {10001, 64, 3 * 4096 + 5};
  const int parties = 3;
  ThreadBarrier barrier(parties);
  std::atomic<int> bad{0};
  onParties(parties, [&](int p) {
    HostGather g(name, p, {4, 5, 6}, sizes, kTimeout);
    for (uint64_t gen = 1; gen <= 4; ++gen) {
      for (size_t j = 0; j < sizes.size(); ++j) {
        const auto [lo, hi] = rangeOf(p, parties, sizes[j]);
        std::vector<uint8_t> mine(hi - lo);
        for (size_t b = lo; b < hi; ++b) mine[b - lo] = valueAt(b, gen);
        g.put(static_cast<int>(j), {{mine.data(), lo, mine.size()}}, true);
      }
      std::vector<std::shared_ptr<char>> held;
      for (size_t j = 0; j < sizes.size(); ++j) {
        held.push_back(g.await(static_cast<int>(j)));
        for (size_t b = 0; b < sizes[j]; ++b)
          if (static_cast<uint8_t>(held[j].get()[b]) != valueAt(b, gen)) ++bad;
      }
      if (g.generation(0) != gen) ++bad;
      for (size_t j = 0; j < sizes.size(); ++j) g.release(static_cast<int>(j));
      barrier.arrive();
    }
    // 3 buckets held at once, 4 times: 3 slots, a few more where ranks raced for a new one at once
    // (each such race leaves a free slot), never one per gather (12).
    if (g.slots() < 3 || g.slots() > 3 * parties) ++bad;
  });
  CHECK_MSG(bad == 0, "%d wrong bytes or slot counts", bad.load());
  CHECK(shmEntries(name).empty());
}

TEST(a_gather_puts_nothing_before_every_rank_released_the_last) {
  const std::string name = uniqueShmPrefix("hg");
  ThreadBarrier barrier(2);
  std::atomic<int> bad{0};
  onParties(2, [&](int p) {
    HostGather g(name, p, {0, 1}, {4096}, kTimeout);
    const uint32_t first = 100 + p, second = 200 + p;
    g.put(0, {{&first, 4 * static_cast<size_t>(p), 4}}, true);
    auto held = g.await(0);
    if (p == 1) {
      g.release(0);
      barrier.arrive();                               // 1: rank 0 still reads gather 1
      if (g.put(0, {{&second, 4, 4}}, false)) ++bad;  // so gather 2 must wait
      if (reinterpret_cast<uint32_t*>(held.get())[0] != 100) ++bad;
      barrier.arrive();  // 2: rank 0 released
      g.put(0, {{&second, 4, 4}}, true);
    } else {
      barrier.arrive();
      barrier.arrive();
      g.release(0);
      g.put(0, {{&second, 0, 4}}, true);
    }
    auto again = g.await(0);
    const auto* v = reinterpret_cast<uint32_t*>(again.get());
    if (v[0] != 200 || v[1] != 201) ++bad;
    g.release(0);
  });
  CHECK_MSG(bad == 0, "%d failed expectations", bad.load());
  CHECK(shmEntries(name).empty());
}

TEST(a_wait_names_the_ranks_it_waits_for) {
  const std::string name = uniqueShmPrefix("hg");
  std::string what;
  ThreadBarrier barrier(2);
  onParties(2, [&](int p) {
    HostGather g(name, p, {3, 7}, {64}, std::chrono::milliseconds(300));
    if (p == 0) {
      const char byte = 1;
      g.put(0, {{&byte, 0, 1}}, true);
      try {
        g.await(0);
      } catch (const TimeoutError& e) {
        what = e.what();
      }
    }
    barrier.arrive();  // rank 7 stays until rank 3 gave up, as a live rank that never put its shard
  });
  CHECK_MSG(what.find("rank 7") != std::string::npos && what.find("gather of bucket 0") != std::string::npos, "%s",
            what.c_str());
  CHECK(shmEntries(name).empty());
}

TEST(a_put_waiting_for_the_last_release_names_the_ranks_still_holding_it) {
  // Ranks 3, 5, 7 (parties 0-2) hold gather 1 of bucket 0; rank 5 and rank 3
  // release it, rank 7 keeps reading. Rank 3's put of gather 2 times out and
  // must name rank 7 alone: not rank 5, which released, nor itself.
  const std::string name = uniqueShmPrefix("hg");
  std::string what;
  ThreadBarrier barrier(3);
  onParties(3, [&](int p) {
    std::optional<HostGather> g;
    if (p == 0) g.emplace(name, p, std::vector<int>{3, 5, 7}, std::vector<size_t>{64}, std::chrono::milliseconds(300));
    barrier.arrive();  // the control segment exists: the others' opens wait for nothing
    if (p != 0) g.emplace(name, p, std::vector<int>{3, 5, 7}, std::vector<size_t>{64}, std::chrono::milliseconds(300));
    const char byte = static_cast<char>(p);
    g->put(0, {{&byte, static_cast<size_t>(p), 1}}, true);
    barrier.arrive();  // every shard is there: no await below waits
    auto held = g->await(0);
    if (p != 2) g->release(0);
    barrier.arrive();  // ranks 3 and 5 released, rank 7 holds
    if (p == 0) {
      try {
        g->put(0, {{&byte, 0, 1}}, true);
      } catch (const TimeoutError& e) {
        what = e.what();
      }
    }
    barrier.arrive();  // rank 7 holds gather 1 until rank 3 gave up
    if (p == 2) g->release(0);
  });
  const std::string lead = "still waiting for ", tail = " to release gather 1";
  const size_t at = what.find(lead), end = what.find(tail);
  const std::string named = at == std::string::npos || end == std::string::npos || end < at
                                ? ""
                                : what.substr(at + lead.size(), end - at - lead.size());
  CHECK_MSG(named == "rank 7", "named '%s': %s", named.c_str(), what.c_str());
  CHECK_MSG(what.find("the release of bucket 0") != std::string::npos, "%s", what.c_str());
  CHECK(shmEntries(name).empty());
}

TEST(a_wait_that_finds_a_local_peer_dead_names_that_peer) {
  // Rank 7 (party 1) is another process: it maps the control segment, says
  // so, and is SIGKILLed before it puts its shard. Rank 3's await must fail
  // at once (not at the 20 s deadline) naming rank 7 and its pid, not itself.
  const std::string name = uniqueShmPrefix("hg");
  int ready[2];
  CHECK(pipe(ready) == 0);
  const pid_t child = fork();
  if (child == 0) {
    close(ready[0]);
    try {
      auto* g = new HostGather(name, 1, {3, 7}, {64}, kTimeout);  // never destroyed: it dies holding it
      (void)g;
      const char r = 'r';
      if (write(ready[1], &r, 1) != 1) _exit(4);
      for (;;) pause();  // until SIGKILL
    } catch (...) {
    }
    _exit(3);
  }
  close(ready[1]);
  std::string what;
  bool timed_out = false;
  double waited_ms = 0;
  {
    HostGather g(name, 0, {3, 7}, {64}, kTimeout);
    char r = 0;
    CHECK(read(ready[0], &r, 1) == 1 && r == 'r');
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status %d", status);
    const char byte = 1;
    g.put(0, {{&byte, 0, 1}}, true);
    const auto start = std::chrono::steady_clock::now();
    try {
      g.await(0);
    } catch (const TimeoutError& e) {
      timed_out = true;
      what = e.what();
    } catch (const CollectiveError& e) {
      what = e.what();
    }
    waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  close(ready[0]);
  CHECK_MSG(!timed_out, "timed out instead: %s", what.c_str());
  CHECK_MSG(what.find("rank 3: local rank 7 (pid " + std::to_string(child) + ") died") != std::string::npos, "%s",
            what.c_str());
  CHECK_MSG(what.find("local rank 3") == std::string::npos, "%s", what.c_str());
  CHECK_MSG(waited_ms < 5000, "waited %.0f ms", waited_ms);
  CHECK(shmEntries(name).empty());
}

TEST(a_rank_that_leaves_ends_the_wait_at_once) {
  const std::string name = uniqueShmPrefix("hg");
  std::string what;
  double waited_ms = 0;
  ThreadBarrier barrier(2);
  onParties(2, [&](int p) {
    if (p == 1) {
      {
        HostGather g(name, 1, {3, 7}, {64}, kTimeout);
      }  // maps the control segment, then leaves
      barrier.arrive();
      return;
    }
    HostGather g(name, 0, {3, 7}, {64}, kTimeout);
    barrier.arrive();
    const char byte = 1;
    g.put(0, {{&byte, 0, 1}}, true);
    const auto start = std::chrono::steady_clock::now();
    try {
      g.await(0);
    } catch (const CollectiveError& e) {
      what = e.what();
    }
    waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  });
  // Named, and long before the 20 s deadline (the liveness probe runs every 100 ms).
  CHECK_MSG(what.find("rank 7") != std::string::npos && what.find("left") != std::string::npos, "%s", what.c_str());
  CHECK_MSG(waited_ms < 5000, "waited %.0f ms", waited_ms);
  CHECK(shmEntries(name).empty());
}

TEST(misuse_is_refused) {
  const std::string name = uniqueShmPrefix("hg");
  HostGather g(name, 0, {0}, {16}, kTimeout);
  const char bytes[32] = {};
  CHECK_THROWS(g.await(0), InvalidArgument);                        // nothing put
  CHECK_THROWS(g.release(0), InvalidArgument);                      // nothing held
  CHECK_THROWS(g.put(1, {{bytes, 0, 1}}, true), InvalidArgument);   // no bucket 1
  CHECK_THROWS(g.put(0, {{bytes, 8, 9}}, true), InvalidArgument);   // past the bucket's end
  CHECK(g.put(0, {{bytes, 0, 8}, {bytes + 8, 8, 8}}, true));        // two pieces
  CHECK_THROWS(g.put(0, {{bytes, 0, 16}}, true), InvalidArgument);  // put twice
  g.await(0);
  g.release(0);
  const std::vector<int> one = {0};
  CHECK_THROWS(HostGather(name + "x", 1, one, {16}, kTimeout), InvalidArgument);
  CHECK_THROWS(HostGather(name + "y", 0, one, {0}, kTimeout), InvalidArgument);
}

HVD_TEST_MAIN()
