// The engine's two negotiation paths (negotiation/controller.h): the decentralized AND of
// cache bits in steady state, the star through the coordinator when some
// rank needs it. Results must be the same on either path; the steady state
// must actually leave the coordinator out; and what only the coordinator
// can do (name mismatches, time stalls) must still happen for ops that are
// already cached. When a rank stalls, the ranks waiting for rank 0 (its
// reply in the star, its result down the host in the AND) wait the relay
// grace for rank 0's last word and name the stalled rank, not rank 0; one
// whose send to rank 0 fails (rank 0 stopped) still reads that word. The
// cycle time (HVDTORCH_CYCLE_TIME, milliseconds) paces the cycles of ranks
// whose ops wait for the others.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "cluster.h"
#include "common/error.h"
#include "config/config.h"
#include "engine/engine.h"
#include "engine/negotiation/control_plane.h"
#include "ops/op_table.h"
#include "ranks.h"
#include "submit.h"

using namespace hvdtorch;
using hvdtorch::test::Cluster;
using hvdtorch::test::finish;
using hvdtorch::test::floats;
using hvdtorch::test::sumOf;
using hvdtorch::test::valuesOf;

namespace {

// One training-like step: three named Sum all-reduces submitted in a rank-
// dependent order, all waited for. Returns the first error, if any.
std::string step(Engine& eng, int r, int p, int32_t set = 0, int set_size = 0) {
  std::vector<TensorPtr> ts;
  std::vector<int64_t> hs;
  for (int k = 0; k < 3; ++k) {
    const int j = (k + r) % 3;
    ts.push_back(floats(std::vector<float>(8 + j, float(j + 1))));
    hs.push_back(sumOf(eng, "grad" + std::to_string(j), ts.back(), set));
  }
  const int n = set_size ? set_size : p;
  for (int k = 0; k < 3; ++k) {
    const std::string err = finish(eng, hs[k], std::chrono::seconds(10));
    if (!err.empty()) return err;
    const int j = (k + r) % 3;
    if (valuesOf(ts[k])[0] != float(n * (j + 1))) return "wrong sum for grad" + std::to_string(j);
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Once `stalled` is set, rank 2's control links swallow every send (to the
// others it is a rank whose process stopped: SIGSTOP, a hung host), and
// rank 0's sends to rank 1 take 200 ms each (a loaded machine: its last
// word comes late, as late as the relay grace must allow for).
Cluster::LinkWrap rank2Stalls(const std::atomic<bool>& stalled) {
  struct Done : LinkRequest {
    void wait(Deadline) override {}
  };
  struct Stalling : Link {
    Stalling(std::unique_ptr<Link> inner, bool swallow, const std::atomic<bool>& stalled)
        : inner(std::move(inner)), swallow(swallow), stalled(stalled) {}
    int peer() const override { return inner->peer(); }
    const char* kind() const override { return inner->kind(); }
    std::unique_ptr<LinkRequest> isend(const void* data, size_t bytes) override {
      if (stalled.load()) {
        if (swallow) return std::make_unique<Done>();
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
      return inner->isend(data, bytes);
    }
    std::unique_ptr<LinkRequest> irecv(void* data, size_t bytes) override { return inner->irecv(data, bytes); }
    std::unique_ptr<Link> inner;
    bool swallow;
    const std::atomic<bool>& stalled;
  };
  return [&stalled](int self, int peer, std::unique_ptr<Link> inner) -> std::unique_ptr<Link> {
    if (self == 2) return std::make_unique<Stalling>(std::move(inner), true, stalled);
    if (self == 0 && peer == 1) return std::make_unique<Stalling>(std::move(inner), false, stalled);
    return inner;
  };
}

// Rank 2 of 3 stalls; ranks 0 and 1 then submit an op. Returns each rank's
// error for it.
std::vector<std::string> stallRank2(Config cfg) {
  cfg.calibrate = false;
  std::atomic<bool> stalled{false};
  Cluster c(3, cfg, nullptr, nullptr, rank2Stalls(stalled));  // timeout 5 s
  c.onEveryRank([&](int r, Engine& eng) { CHECK(step(eng, r, 3).empty()); });
  stalled = true;
  std::vector<std::string> errors(2);
  c.onEveryRank([&](int r, Engine& eng) {
    if (r == 2) return;
    errors[r] = finish(eng, sumOf(eng, "after", floats(std::vector<float>(8, 1.f))), std::chrono::seconds(20));
  });
  return errors;
}

// p engines over in-process fabrics with `cfg` exactly as given (Cluster
// sets its own cycle time and timeout).
struct Engines {
  Engines(int p, const Config& cfg) : control(p), data(p), engines(p) {
    std::vector<std::thread> ts;
    for (int r = 0; r < p; ++r)
      ts.emplace_back([this, r, p, &cfg] {
        Engine::Transports t;
        t.control = [this, r](int peer) { return control.link(r, peer); };
        t.data = [this, r](int peer) { return data.link(r, peer); };
        engines[r] = std::make_unique<Engine>(cfg, Topology::build(r, std::vector<int>(p, 0)), t, ops::opTable());
      });
    for (auto& t : ts) t.join();
  }
  ~Engines() {
    std::vector<std::thread> ts;
    for (auto& e : engines) ts.emplace_back([&e] { e->shutdown(); });
    for (auto& t : ts) t.join();
  }
  InProcFabric control, data;
  std::vector<std::unique_ptr<Engine>> engines;
};

}  // namespace

TEST(steady_state_leaves_the_coordinator_out) {
  const int p = 4, steps = 40;
  Cluster c(p);
  std::vector<Engine::NegotiationStats> before(p), after(p);
  c.onEveryRank([&](int r, Engine& eng) {
    CHECK_MSG(step(eng, r, p).empty(), "rank %d: first step", r);  // negotiated in full, cached
    before[r] = eng.negotiationStats();
    for (int s = 0; s < steps; ++s) {
      const std::string err = step(eng, r, p);
      CHECK_MSG(err.empty(), "rank %d step %d: %s", r, s, err.c_str());
    }
    after[r] = eng.negotiationStats();
  });
  for (int r = 0; r < p; ++r) {
    const uint64_t dec = after[r].decentralized - before[r].decentralized;
    const uint64_t star = after[r].star - before[r].star;
    // Every step needs at least one round that finds its ops ready; on a
    // loaded machine a rank may lag past the grace and call the star in,
    // but most steps must not need it.
    CHECK_MSG(dec >= steps / 2 && star <= steps / 2, "rank %d: %llu decentralized, %llu star rounds", r,
              (unsigned long long)dec, (unsigned long long)star);
  }
}

TEST(decentralized_off_takes_the_star_every_round) {
  Config cfg;
  cfg.decentralized = false;
  const int p = 3;
  Cluster c(p, cfg);
  c.onEveryRank([&](int r, Engine& eng) {
    for (int s = 0; s < 5; ++s) CHECK_MSG(step(eng, r, p).empty(), "rank %d step %d", r, s);
    CHECK(eng.negotiationStats().decentralized == 0);
    CHECK(eng.negotiationStats().star > 0);
  });
}

TEST(process_set_steady_state_is_decentralized_too) {
  const int p = 4, steps = 30;
  Cluster c(p);
  std::vector<Engine::NegotiationStats> before(p), after(p);
  int32_t id = -1;
  c.onEveryRank([&](int r, Engine& eng) {
    const int32_t mine = eng.addProcessSet({1, 3});
    if (r == 0) id = mine;
  });
  c.onEveryRank([&](int r, Engine& eng) {
    if (r != 1 && r != 3) return;  // ranks 0 and 2 stay idle
    CHECK(step(eng, r, p, id, 2).empty());
    before[r] = eng.negotiationStats();
    for (int s = 0; s < steps; ++s) {
      const std::string err = step(eng, r, p, id, 2);
      CHECK_MSG(err.empty(), "rank %d step %d: %s", r, s, err.c_str());
    }
    after[r] = eng.negotiationStats();
  });
  for (int r : {1, 3}) {
    // Each cycle is a global round plus the set's round; both are mostly
    // decentralized.
    const uint64_t dec = after[r].decentralized - before[r].decentralized;
    const uint64_t star = after[r].star - before[r].star;
    CHECK_MSG(dec >= steps && star <= steps, "rank %d: %llu decentralized, %llu star rounds", r,
              (unsigned long long)dec, (unsigned long long)star);
  }
}

TEST(a_changed_signature_of_a_cached_op_is_a_mismatch_everywhere) {
  const int p = 3;
  Cluster c(p);
  std::vector<std::string> errors(p);
  c.onEveryRank([&](int r, Engine& eng) {
    for (int s = 0; s < 3; ++s) CHECK(step(eng, r, p).empty());  // grad0..2 cached
    // Rank 2 changes grad1's shape: its lookup misses, so it sends the
    // request in full and calls the coordinator in, which sees the others'
    // cache bits against rank 2's request.
    errors[r] =
        finish(eng, sumOf(eng, "grad1", floats(std::vector<float>(r == 2 ? 5 : 9, 1.f))), std::chrono::seconds(10));
    CHECK_MSG(step(eng, r, p).empty(), "rank %d: the engine goes on", r);
  });
  for (int r = 0; r < p; ++r) {
    CHECK_MSG(errors[r].find("mismatched allreduce 'grad1'") != std::string::npos, "rank %d: %s", r, errors[r].c_str());
    CHECK_MSG(errors[r].find("ranks [2]") != std::string::npos, "rank %d: %s", r, errors[r].c_str());
  }
}

TEST(a_cached_op_one_rank_never_submits_times_out_naming_it) {
  Config cfg;
  cfg.stall_warning = std::chrono::milliseconds(200);
  const int p = 3;
  Cluster c(p, cfg);  // timeout 5 s
  c.onEveryRank([&](int r, Engine& eng) { CHECK(step(eng, r, p).empty()); });
  // Only ranks 0 and 1 submit grad0 again: its bit never survives the AND,
  // so after the grace they call the coordinator in, which times it.
  std::vector<std::string> errors(2);
  std::vector<double> waited(2);
  c.onEveryRank([&](int r, Engine& eng) {
    if (r == 2) return;
    const auto t0 = std::chrono::steady_clock::now();
    errors[r] = finish(eng, sumOf(eng, "grad0", floats(std::vector<float>(8, 1.f))), std::chrono::seconds(20));
    waited[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  for (int r = 0; r < 2; ++r) {
    CHECK_MSG(errors[r].find("ranks [2] did not submit it") != std::string::npos, "rank %d: %s", r, errors[r].c_str());
    // The timeout (5 s) counts from the coordinator's first sight, at most
    // the grace (100 ms) late; allow for a loaded machine.
    CHECK_MSG(waited[r] >= 4.9 && waited[r] < 8.0, "rank %d failed after %.2f s", r, waited[r]);
  }
}

TEST(a_rank_waiting_for_rank_0s_reply_names_the_stalled_rank_rank_0_carries) {
  // The star every cycle: rank 0 waits for rank 2's message until the
  // timeout, then stops and sends its last word naming rank 2 (200 ms late).
  // Rank 1, which waits for rank 0's reply, waits the relay grace (1 s)
  // longer and fails with that word: rank 2 named, not a timeout of its own
  // on rank 0.
  Config cfg;
  cfg.decentralized = false;
  const auto errors = stallRank2(cfg);
  for (int r = 0; r < 2; ++r)
    CHECK_MSG(contains(errors[r], "rank 0: timed out receiving from rank 2") &&
                  !contains(errors[r], "timed out receiving from rank 0"),
              "rank %d: %s", r, errors[r].c_str());
}

TEST(a_hosts_ranks_name_the_rank_that_stalled_their_leaders_and) {
  // The steady state (the AND, one host of 3): rank 0, the host's leader,
  // waits for rank 2's vector until the timeout; rank 1, waiting for the
  // result from rank 0, must get rank 0's last word (200 ms late) naming
  // rank 2.
  const auto errors = stallRank2(Config{});
  for (int r = 0; r < 2; ++r)
    CHECK_MSG(contains(errors[r], "rank 0: timed out receiving from rank 2") &&
                  !contains(errors[r], "timed out receiving from rank 0"),
              "rank %d: %s", r, errors[r].c_str());
}

TEST(the_star_reply_waits_the_relay_grace_for_rank_0s_last_word) {
  // ControlPlane::exchange on 3 ranks whose waits all end at one operation
  // deadline; rank 2 stalls (never sends its message). Rank 0 gathers until
  // the deadline and then sends its last word naming rank 2, 200 ms late (a
  // loaded machine). Rank 1 must return that word (a ResponseList with
  // shutdown set) from its wait for rank 0's reply: it waits the relay
  // grace (a quarter of the 4 s timeout, 1 s) past the deadline.
  const Deadline shared = Deadline::after(std::chrono::milliseconds(300));
  std::vector<char> reply;
  const auto outcomes = hvdtorch::test::runRanksOutcomes(
      {0, 0, 0},
      [&](Context& ctx) {
        if (ctx.rank() == 2) return;  // stalled
        const OperationDeadline op(shared);
        ControlPlane plane(ctx);
        try {
          std::vector<char> got = plane.exchange(
              RankMessage{}.serialize(), [](std::vector<std::vector<char>>&) { return ResponseList{}.serialize(); });
          if (ctx.rank() == 1) reply = std::move(got);
        } catch (const TimeoutError& e) {
          if (ctx.rank() == 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            ResponseList last;
            last.shutdown = true;
            last.shutdown_rank = 0;
            last.shutdown_reason = strCat("rank 0: lost contact with the other ranks during negotiation: ", e.what());
            plane.sendLastWord(last.serialize());
            plane.dropPosted();
          }
          throw;
        }
      },
      std::chrono::milliseconds(4000));
  CHECK_MSG(contains(outcomes[0].what, "rank 0: timed out receiving from rank 2"), "rank 0: %s",
            outcomes[0].what.c_str());
  CHECK_MSG(outcomes[1].ok() && !reply.empty(), "rank 1 did not wait for rank 0's word: %s", outcomes[1].what.c_str());
  if (!reply.empty()) {
    const ResponseList last = ResponseList::parse(reply);
    CHECK_MSG(last.shutdown && last.shutdown_rank == 0 &&
                  contains(last.shutdown_reason, "rank 0: timed out receiving from rank 2"),
              "rank 1 got: %s", last.shutdown_reason.c_str());
  }
}

TEST(a_failed_send_to_rank_0_still_returns_rank_0s_last_word) {
  // Rank 0 stopped right after its last word: rank 1's send of its message
  // fails (the link closed), and the last word, naming the rank that
  // stalled, is on its way. Rank 1 must wait for it briefly (200 ms) and
  // return it rather than report the closed link. Rank 0's word leaves 20 ms
  // after rank 1's send failed, so it is not there yet when the send fails.
  std::atomic<bool> send_failed{false};
  struct FailingSend : Link {
    FailingSend(std::unique_ptr<Link> inner, std::atomic<bool>& failed) : inner(std::move(inner)), failed(failed) {}
    int peer() const override { return inner->peer(); }
    const char* kind() const override { return inner->kind(); }
    std::unique_ptr<LinkRequest> isend(const void*, size_t) override {
      failed = true;
      throw PeerClosed("rank 1: link to rank 0 closed");
    }
    std::unique_ptr<LinkRequest> irecv(void* data, size_t bytes) override { return inner->irecv(data, bytes); }
    std::unique_ptr<Link> inner;
    std::atomic<bool>& failed;
  };
  std::vector<char> reply;
  const auto outcomes = hvdtorch::test::runRanksOutcomes(
      {0, 0},
      [&](Context& ctx) {
        ControlPlane plane(ctx);
        if (ctx.rank() == 1) {
          reply = plane.exchange(RankMessage{}.serialize(),
                                 [](std::vector<std::vector<char>>&) { return ResponseList{}.serialize(); });
          return;
        }
        ctx.link(1);  // the link exists before rank 0 speaks its last word (sendLastWord opens none)
        while (!send_failed.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        ResponseList last;
        last.shutdown = true;
        last.shutdown_rank = 0;
        last.shutdown_reason = "rank 0: timed out receiving from rank 2";
        plane.sendLastWord(last.serialize());
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the links stay open while rank 1 reads
        plane.dropPosted();
      },
      std::chrono::milliseconds(4000), nullptr,
      [&send_failed](int self, int peer, std::unique_ptr<Link> inner) -> std::unique_ptr<Link> {
        if (self == 1 && peer == 0) return std::make_unique<FailingSend>(std::move(inner), send_failed);
        return inner;
      });
  CHECK_MSG(outcomes[0].ok(), "rank 0: %s", outcomes[0].what.c_str());
  CHECK_MSG(outcomes[1].ok() && !reply.empty(), "rank 1 reported the failed send, not rank 0's last word: %s",
            outcomes[1].what.c_str());
  if (!reply.empty()) {
    const ResponseList last = ResponseList::parse(reply);
    CHECK_MSG(last.shutdown && contains(last.shutdown_reason, "timed out receiving from rank 2"), "rank 1 got: %s",
              last.shutdown_reason.c_str());
  }
}

TEST(the_cycle_time_is_read_in_milliseconds) {
  // HVDTORCH_CYCLE_TIME=20 is 20 ms. While a rank's ops wait for the other
  // ranks it runs one negotiation cycle per cycle time: 2 ranks, each with
  // an op the other has not submitted, run at most one cycle per 20 ms of
  // the window (read as microseconds: thousands a second, a core spinning).
  setenv("HVDTORCH_CYCLE_TIME", "20", 1);
  const Config cfg = Config::load({{"timeout", "10"}, {"calibrate", "0"}});
  unsetenv("HVDTORCH_CYCLE_TIME");
  CHECK_MSG(cfg.cycle_time == std::chrono::milliseconds(20), "cycle time %lld us",
            static_cast<long long>(cfg.cycle_time.count()));
  const int p = 2;
  Engines c(p, cfg);
  for (auto& e : c.engines) CHECK(e->cycleTime() == std::chrono::milliseconds(20));
  std::vector<TensorPtr> ts;
  std::vector<int64_t> hs;
  for (int r = 0; r < p; ++r) {
    ts.push_back(floats(std::vector<float>(8, 1.f)));
    hs.push_back(sumOf(*c.engines[r], "only" + std::to_string(r), ts.back()));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // both ranks are waiting now
  auto rounds = [&](int r) {
    const auto s = c.engines[r]->negotiationStats();
    return s.decentralized + s.star;
  };
  std::vector<uint64_t> before(p), after(p);
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < p; ++r) before[r] = rounds(r);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  for (int r = 0; r < p; ++r) after[r] = rounds(r);
  const double window_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < p; ++r) {
    const double n = static_cast<double>(after[r] - before[r]);
    // At most one cycle per cycle time (each waits that long first), and
    // not far fewer (a loaded machine stretches a cycle, not by 10x).
    CHECK_MSG(n <= window_ms / 20 + 2 && n >= window_ms / 200, "rank %d: %.0f cycles in %.0f ms (cycle 20 ms)", r, n,
              window_ms);
  }
  // Each rank submits the other's op: every op completes.
  for (int r = 0; r < p; ++r) {
    ts.push_back(floats(std::vector<float>(8, 1.f)));
    hs.push_back(sumOf(*c.engines[r], "only" + std::to_string(1 - r), ts.back()));
  }
  for (int r = 0; r < p; ++r)
    for (int64_t h : {hs[r], hs[p + r]}) CHECK(finish(*c.engines[r], h, std::chrono::seconds(20)).empty());
}

HVD_TEST_MAIN()
