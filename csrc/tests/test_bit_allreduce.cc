// The coordinator-free AND of the ranks' bit vectors: the result on every
// rank against an AND computed here, for many sizes and host layouts; the
// O(log p) message bound per rank; that in the hierarchical shape only
// one rank per host sends or receives across hosts; and that a host's ranks
// wait for their leader's word long enough to name a stall on another host.
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "check.h"
#include "common/error.h"
#include "engine/negotiation/bit_allreduce.h"
#include "engine/negotiation/control_frame.h"
#include "engine/request.h"
#include "ranks.h"

using namespace hvdtorch;

namespace {

// Rank r's vector: all ones, minus bit (r * 7 + w) % 64 of word w, and
// minus bit 63 of word 0 on the last rank only.
std::vector<uint64_t> vectorOf(int r, int p, size_t words) {
  std::vector<uint64_t> v(words, ~uint64_t(0));
  for (size_t w = 0; w < words; ++w) v[w] &= ~(uint64_t(1) << ((r * 7 + w) % 64));
  if (r == p - 1) v[0] &= ~(uint64_t(1) << 63);
  return v;
}

std::vector<uint64_t> expectedAnd(int p, size_t words) {
  std::vector<uint64_t> all(words, ~uint64_t(0));
  for (int r = 0; r < p; ++r) {
    const auto v = vectorOf(r, p, words);
    for (size_t w = 0; w < words; ++w) all[w] &= v[w];
  }
  return all;
}

int log2floor(int p) { return p <= 1 ? 0 : static_cast<int>(std::floor(std::log2(p))); }
int log2ceil(int p) { return p <= 1 ? 0 : static_cast<int>(std::ceil(std::log2(p))); }

std::vector<int> hostsOf(int p, int per_host) {
  std::vector<int> h(p);
  for (int r = 0; r < p; ++r) h[r] = r / per_host;
  return h;
}

// A link that counts the messages it carries (both directions) into a
// shared counter: the test's view of cross-host traffic.
class CountingLink : public Link {
 public:
  CountingLink(std::unique_ptr<Link> inner, std::atomic<int>* counter) : inner_(std::move(inner)), counter_(counter) {}
  int peer() const override { return inner_->peer(); }
  const char* kind() const override { return "counting"; }
  std::unique_ptr<LinkRequest> isend(const void* d, size_t n) override {
    ++*counter_;
    return inner_->isend(d, n);
  }
  std::unique_ptr<LinkRequest> irecv(void* d, size_t n) override {
    ++*counter_;
    return inner_->irecv(d, n);
  }

 private:
  std::unique_ptr<Link> inner_;
  std::atomic<int>* counter_;
};

}  // namespace

TEST(flat_and_matches_reference_with_log_messages) {
  for (int p : {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 33}) {
    for (size_t words : {size_t(1), size_t(3)}) {
      std::vector<BitAllreduceCost> costs(p);
      std::vector<std::vector<uint64_t>> results(p);
      hvdtorch::test::runRanks(std::vector<int>(p, 0), [&](Context& ctx) {
        auto v = vectorOf(ctx.rank(), p, words);
        bitAndAllreduce(ctx, v, ctx.deadline(), BitAllreduceShape::kFlat, &costs[ctx.rank()]);
        results[ctx.rank()] = v;
      });
      const auto want = expectedAnd(p, words);
      for (int r = 0; r < p; ++r) {
        CHECK_MSG(results[r] == want, "p=%d words=%zu rank %d", p, words, r);
        CHECK_MSG(costs[r].messages() <= 2 * log2floor(p) + 2, "p=%d rank %d handled %d messages", p, r,
                  costs[r].messages());
        CHECK(costs[r].bytes_sent == size_t(costs[r].sent) * kFrameBytes);  // one control frame each
      }
    }
  }
}

TEST(hierarchical_and_matches_reference) {
  struct Layout {
    int p, per_host;
  };
  for (Layout l : {Layout{4, 2}, Layout{6, 3}, Layout{8, 4}, Layout{12, 4}, Layout{10, 3}, Layout{16, 16},
                   Layout{32, 8}, Layout{5, 1}}) {
    std::vector<BitAllreduceCost> costs(l.p);
    std::vector<std::vector<uint64_t>> results(l.p);
    const auto hosts = hostsOf(l.p, l.per_host);
    hvdtorch::test::runRanks(hosts, [&](Context& ctx) {
      auto v = vectorOf(ctx.rank(), l.p, 2);
      bitAndAllreduce(ctx, v, ctx.deadline(), BitAllreduceShape::kHierarchical, &costs[ctx.rank()]);
      results[ctx.rank()] = v;
    });
    const auto want = expectedAnd(l.p, 2);
    const int num_hosts = hosts.back() + 1;
    for (int r = 0; r < l.p; ++r) {
      CHECK_MSG(results[r] == want, "p=%d per_host=%d rank %d", l.p, l.per_host, r);
      const int local = std::min(l.per_host, l.p - (r / l.per_host) * l.per_host);
      const int bound = 2 * log2ceil(local) + 2 * log2floor(num_hosts) + 2;
      CHECK_MSG(costs[r].messages() <= bound, "p=%d per_host=%d rank %d handled %d > %d", l.p, l.per_host, r,
                costs[r].messages(), bound);
    }
  }
}

TEST(hierarchical_crosses_hosts_on_one_rank_per_host) {
  // 4 hosts x 4 ranks; same-host links from one fabric, cross-host links
  // from another whose messages are counted per rank.
  const int p = 16, per_host = 4;
  const auto hosts = hostsOf(p, per_host);
  InProcFabric remote(p), local(p);
  std::vector<std::atomic<int>> cross(p);
  std::vector<std::vector<uint64_t>> results(p);
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r) {
    threads.emplace_back([&, r] {
      Context ctx(
          Topology::build(r, hosts),
          [&, r](int peer) { return std::make_unique<CountingLink>(remote.link(r, peer), &cross[r]); },
          [&, r](int peer) { return local.link(r, peer); }, nullptr, std::chrono::milliseconds(20000));
      auto v = vectorOf(r, p, 1);
      bitAndAllreduce(ctx, v, ctx.deadline(), BitAllreduceShape::kHierarchical);
      results[r] = v;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < p; ++r) {
    CHECK(results[r] == expectedAnd(p, 1));
    if (r % per_host == 0) {
      CHECK_MSG(cross[r] == 2 * 2, "leader %d: %d cross-host messages", r, cross[r].load());  // log2(4 hosts) exchanges
    } else {
      CHECK_MSG(cross[r] == 0, "rank %d sent or received %d messages across hosts", r, cross[r].load());
    }
  }
}

TEST(dead_rank_fails_the_others_by_the_deadline) {
  // p = 5: rank 4 folds into rank 0; ranks 2 and 1 wait on the absent rank 3
  // directly (masks 1 and 2), rank 0 on rank 2, rank 4 on rank 0. Every one
  // of them must fail by the deadline rather than hang.
  const auto outcomes = hvdtorch::test::runRanksOutcomes(
      std::vector<int>(5, 0),
      [](Context& ctx) {
        if (ctx.rank() == 3) return;  // never takes part
        std::vector<uint64_t> v(1, ~uint64_t(0));
        bitAndAllreduce(ctx, v, ctx.deadline(), BitAllreduceShape::kFlat);
      },
      std::chrono::milliseconds(300));
  CHECK(outcomes[3].ok());
  for (int r : {0, 1, 2, 4}) {
    bool collective = false;
    try {
      if (outcomes[r].error) std::rethrow_exception(outcomes[r].error);
    } catch (const CollectiveError&) {
      collective = true;
    } catch (...) {
    }
    CHECK_MSG(collective, "rank %d: %s", r, outcomes[r].what.c_str());
  }
}

TEST(long_vectors_travel_as_frame_and_tail) {
  // 700 words do not fit one control frame: each message is a frame plus a tail.
  for (int p : {2, 3, 5}) {
    std::vector<std::vector<uint64_t>> results(p);
    hvdtorch::test::runRanks(std::vector<int>(p, 0), [&](Context& ctx) {
      auto v = vectorOf(ctx.rank(), p, 700);
      bitAndAllreduce(ctx, v, ctx.deadline(), BitAllreduceShape::kFlat);
      results[ctx.rank()] = v;
    });
    for (int r = 0; r < p; ++r) CHECK_MSG(results[r] == expectedAnd(p, 700), "p=%d rank %d", p, r);
  }
}

TEST(a_last_word_in_place_of_a_vector_names_the_peer_and_its_cause) {
  // Rank 1 stops: instead of its vector it sends its last word, as the
  // engine does after an error. Rank 0 must pass the cause on, not time out.
  const auto outcomes = hvdtorch::test::runRanksOutcomes(
      std::vector<int>(2, 0),
      [](Context& ctx) {
        if (ctx.rank() == 1) {
          ResponseList last;
          last.shutdown = true;
          last.shutdown_rank = 1;
          last.shutdown_reason = "rank 1: the data plane lost rank 7";
          const std::vector<char> bytes = last.serialize();
          sendFrame(ctx.link(0), FrameKind::kLastWord, bytes.data(), bytes.size(), ctx.deadline());
          return;
        }
        std::vector<uint64_t> v(2, ~uint64_t(0));
        bitAndAllreduce(ctx, v, ctx.deadline(), BitAllreduceShape::kFlat);
      },
      std::chrono::milliseconds(5000));
  CHECK(outcomes[1].ok());
  bool stopped = false;
  try {
    if (outcomes[0].error) std::rethrow_exception(outcomes[0].error);
  } catch (const PeerStopped& e) {
    stopped = e.peer() == 1;
  } catch (...) {
  }
  CHECK_MSG(stopped, "rank 0: %s", outcomes[0].what.c_str());
  CHECK_MSG(outcomes[0].what.find("rank 1 stopped: rank 1: the data plane lost rank 7") != std::string::npos, "%s",
            outcomes[0].what.c_str());
}

TEST(a_hosts_ranks_wait_for_their_leaders_word_naming_a_stall_on_another_host) {
  // Hosts {0, 1} and {2, 3}; rank 2, host 1's leader, stalls: its vector
  // never comes. Every rank's waits end at one deadline (the engine's ranks
  // start a cycle's AND within a cycle of each other). Rank 0, host 0's
  // leader, waits for rank 2 across hosts until then and, as the engine
  // does, sends its last word naming rank 2 down its host, late (200 ms:
  // a loaded machine). Rank 1, waiting for its leader's result, must wait
  // the relay grace (a quarter of the 4 s timeout, 1 s) and pass on that
  // word naming rank 2, not time out at the deadline blaming rank 0.
  const Deadline shared = Deadline::after(std::chrono::milliseconds(300));
  const auto outcomes = hvdtorch::test::runRanksOutcomes(
      {0, 0, 1, 1},
      [&](Context& ctx) {
        if (ctx.rank() == 2) return;  // stalled: never takes part
        std::vector<uint64_t> v(1, ~uint64_t(0));
        try {
          bitAndAllreduce(ctx, v, shared, BitAllreduceShape::kHierarchical);
        } catch (const TimeoutError& e) {
          if (ctx.rank() == 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            ResponseList last;
            last.shutdown = true;
            last.shutdown_rank = 0;
            last.shutdown_reason = strCat("rank 0: lost contact with the other ranks during negotiation: ", e.what());
            const std::vector<char> bytes = last.serialize();
            sendFrame(ctx.link(1), FrameKind::kLastWord, bytes.data(), bytes.size(),
                      Deadline::after(std::chrono::milliseconds(1000)));
          }
          throw;
        }
      },
      std::chrono::milliseconds(4000));
  CHECK_MSG(outcomes[0].what.find("timed out receiving from rank 2") != std::string::npos, "rank 0: %s",
            outcomes[0].what.c_str());
  bool stopped = false;
  try {
    if (outcomes[1].error) std::rethrow_exception(outcomes[1].error);
  } catch (const PeerStopped& e) {
    stopped = e.peer() == 0;
  } catch (...) {
  }
  CHECK_MSG(stopped, "rank 1 did not wait for rank 0's word: %s", outcomes[1].what.c_str());
  CHECK_MSG(outcomes[1].what.find("rank 0: timed out receiving from rank 2") != std::string::npos &&
                outcomes[1].what.find("receiving from rank 0") == std::string::npos,
            "rank 1 does not name the stalled rank: %s", outcomes[1].what.c_str());
}

HVD_TEST_MAIN()
