// The engine's two negotiation paths (negotiation/controller.h): the decentralized AND of
// cache bits in steady state, the star through the coordinator when some
// rank needs it. Results must be the same on either path; the steady state
// must actually leave the coordinator out; and what only the coordinator
// can do (name mismatches, time stalls) must still happen for ops that are
// already cached.
#include <string>
#include <vector>

#include "check.h"
#include "cluster.h"
#include "common/error.h"
#include "engine/engine.h"
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

HVD_TEST_MAIN()
