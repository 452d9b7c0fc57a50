// The `auto` choice (cost_model.h, reducer_set.h): which reducer the model
// picks from given timings, stragglers included; how online refinement moves
// the choice (once, to a reducer that proves faster, and never back and
// forth); and that ranks whose local timings differ end with the same model.
// Timings are fed in directly, so the expected choices do not depend on how
// fast this machine is.
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "algorithms/central_allreduce.h"
#include "algorithms/cost_model.h"
#include "algorithms/link_cost.h"
#include "algorithms/node_allreduce.h"
#include "algorithms/reducer_set.h"
#include "check.h"
#include "cluster.h"
#include "ranks.h"
#include "submit.h"

using namespace hvdtorch;
using hvdtorch::test::runRanks;

namespace {

constexpr ReducerId kA = 0, kB = 1, kC = 2;
constexpr double kUs = 1e-6;

// Three reducers; the priors rank A cheapest at every size, then B, then C.
CostModel threeReducers() { return CostModel({10 * kUs, 20 * kUs, 30 * kUs}, {1e-9, 2e-9, 3e-9}); }
const std::vector<bool> kAll = {true, true, true};

// Folds this one rank's statistics, as agree() would with one rank.
bool foldLocal(CostModel& m, const std::vector<bool>& anchors = kAll) { return m.fold(m.localStats(), anchors); }

void observeMany(CostModel& m, ReducerId id, size_t bytes, const std::vector<double>& us) {
  for (double t : us) m.observe(id, bytes, t * kUs);
}

}  // namespace

TEST(bands_cover_every_size) {
  CHECK(SizeBands::of(0) == 0);
  CHECK(SizeBands::of(4 << 10) == 0);
  CHECK(SizeBands::of((8 << 10) - 1) == 0);
  CHECK(SizeBands::of(8 << 10) == 1);
  CHECK(SizeBands::of(16 << 10) == 1);
  CHECK(SizeBands::of(64 << 20) == 7);
  CHECK(SizeBands::of(size_t(256) << 20) == SizeBands::kCount - 1);
  CHECK(SizeBands::of(size_t(4) << 30) == SizeBands::kCount - 1);
  for (int b = 0; b < SizeBands::kCount; ++b) CHECK(SizeBands::of(SizeBands::bytes(b)) == b);
}

TEST(priors_pick_the_first_choice_before_anything_is_measured) {
  CostModel m = threeReducers();
  CHECK(m.choose(4 << 10, kAll, kAll) == kA);
  CHECK(m.choose(4 << 10, {false, true, true}, kAll) == kB);  // A cannot serve this op
  CHECK(m.choose(4 << 10, {false, false, false}, kAll) == kAutoReducer);
}

TEST(fit_per_band_from_timings_ignores_a_straggler) {
  CostModel m = threeReducers();
  const size_t small = 4 << 10, large = size_t(64) << 20;
  // Small: B is twice as fast as A, except one straggling repetition of B
  // (a descheduled rank) that a mean or a maximum would let decide.
  observeMany(m, kA, small, {300, 306, 294, 303, 297, 300, 309, 291});
  observeMany(m, kB, small, {150, 153, 15000, 147, 150});
  observeMany(m, kC, small, {900, 930, 915, 885, 900});
  // Large: A is faster; one of its repetitions straggles.
  observeMany(m, kA, large, {30000, 31000, 900000, 30500, 29500, 30000, 30200, 29800});
  observeMany(m, kB, large, {45000, 46000, 44000, 45500, 45000});
  foldLocal(m);
  CHECK(m.choose(small, kAll, kAll) == kA);           // B only challenges so far
  observeMany(m, kB, small, {150, 152, 148, 15000});  // its confirmation: another straggler among them
  observeMany(m, kA, small, {300, 300});
  foldLocal(m);
  CHECK(m.choose(small, kAll, kAll) == kB);
  CHECK(m.choose(large, kAll, kAll) == kA);
  CHECK_MSG(m.measured(0, kB) < 160 * kUs, "B's small estimate %.1f us", m.measured(0, kB) / kUs);
  CHECK_MSG(m.measured(7, kA) < 32000 * kUs, "A's large estimate %.1f us", m.measured(7, kA) / kUs);
  // A band nobody measured keeps the priors' choice.
  CHECK(m.choose(size_t(1) << 20, kAll, kAll) == kA);
}

TEST(a_candidate_that_is_only_slightly_faster_does_not_take_over) {
  CostModel m = threeReducers();
  observeMany(m, kA, 1 << 20, {1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000});
  observeMany(m, kB, 1 << 20, {850, 850, 850, 850});  // 15%: within the margin
  foldLocal(m);
  observeMany(m, kB, 1 << 20, {850, 850, 850, 850});  // and again: no confirmation of anything
  foldLocal(m);
  CHECK(m.choose(1 << 20, kAll, kAll) == kA);
  CHECK(m.switches(SizeBands::of(1 << 20)) == 0);
}

TEST(a_few_microseconds_are_no_reason_to_switch) {
  CostModel m = threeReducers();
  observeMany(m, kA, 4 << 10, {100, 100, 100, 100, 100, 100, 100, 100});
  observeMany(m, kC, 4 << 10, {60, 60, 60, 60});  // 40% faster, but by 40 us
  foldLocal(m);
  observeMany(m, kC, 4 << 10, {60, 60, 60, 60});
  foldLocal(m);
  CHECK(m.choose(4 << 10, kAll, kAll) == kA);
  CHECK(m.switches(0) == 0);
}

TEST(an_incumbent_is_not_judged_on_its_first_few_samples) {
  CostModel m = threeReducers();
  observeMany(m, kA, 4 << 10, {900, 900, 900});  // a slow start (first use, a burst of load)
  observeMany(m, kB, 4 << 10, {100, 100, 100, 100});
  foldLocal(m);
  CHECK(m.choose(4 << 10, kAll, kAll) == kA);
  observeMany(m, kA, 4 << 10, {900, 900, 900, 900, 900});  // now mature, and still slow
  observeMany(m, kB, 4 << 10, {100});                      // and B measured again meanwhile
  foldLocal(m);
  CHECK(m.choose(4 << 10, kAll, kAll) == kA);  // B challenges
  observeMany(m, kB, 4 << 10, {100, 100, 100, 100});
  foldLocal(m);
  CHECK(m.choose(4 << 10, kAll, kAll) == kB);  // and is confirmed
}

TEST(a_win_that_is_not_confirmed_does_not_switch) {
  // B wins one window by far (a lucky spell), then runs no faster than A on
  // its confirmation samples: A stays, and B is no challenger any more.
  CostModel m = threeReducers();
  observeMany(m, kA, 1 << 20, {1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000});
  observeMany(m, kB, 1 << 20, {500, 500, 500, 500});
  foldLocal(m);
  CHECK(m.choose(1 << 20, kAll, kAll) == kA);
  // Until its confirmation samples are in, a fold does not judge the band.
  // (Over its whole window, lucky spell included, B would still win.)
  observeMany(m, kB, 1 << 20, {700, 1010});
  observeMany(m, kA, 1 << 20, {1000, 1000});
  foldLocal(m);
  CHECK(m.choose(1 << 20, kAll, kAll) == kA);
  observeMany(m, kB, 1 << 20, {1000, 1020});
  foldLocal(m);
  CHECK(m.choose(1 << 20, kAll, kAll) == kA);
  CHECK(m.switches(SizeBands::of(1 << 20)) == 0);
  // A later, confirmed win still switches: named again, then confirmed.
  observeMany(m, kB, 1 << 20, {500, 500, 500, 500});
  foldLocal(m);
  CHECK(m.choose(1 << 20, kAll, kAll) == kA);
  observeMany(m, kB, 1 << 20, {500, 500, 500, 500});
  foldLocal(m);
  CHECK(m.choose(1 << 20, kAll, kAll) == kB);
  CHECK(m.switches(SizeBands::of(1 << 20)) == 1);
}

TEST(online_exploration_confirms_a_challenger_on_real_ops) {
  // pickForRun explores a named challenger until its confirmation samples
  // are in, and no further.
  CostModel m = threeReducers();
  const size_t bytes = 1 << 20;
  observeMany(m, kA, bytes, {1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000});
  observeMany(m, kB, bytes, {500, 500, 500, 500});
  observeMany(m, kC, bytes, {3000, 3000, 3000, 3000});
  foldLocal(m);
  int b_runs = 0;
  for (int i = 0; i < 40; ++i) {
    const ReducerId id = m.pickForRun(bytes, kAll, kAll);
    m.observe(id, bytes, (id == kB ? 500 : 1000) * kUs);
    b_runs += id == kB;
  }
  CHECK_MSG(b_runs == CostModel::kExploreSamples, "B ran %d times", b_runs);
}

TEST(load_after_exploration_does_not_move_the_choice) {
  // B was explored next to A and was no faster. Later the machine gets busy
  // and A, which keeps running, looks twice as slow as B did back then: that
  // is no evidence against A: the choice stays, and B is not explored again.
  CostModel m = threeReducers();
  observeMany(m, kA, 4 << 10, {100, 100, 100, 100, 100, 100, 100, 100});
  observeMany(m, kB, 4 << 10, {100, 100, 100, 100});
  observeMany(m, kC, 4 << 10, {300, 300, 300, 300});
  foldLocal(m);
  int others = 0;
  for (int i = 0; i < 64; ++i) {
    const ReducerId id = m.pickForRun(4 << 10, kAll, kAll);
    m.observe(id, 4 << 10, 250 * kUs);  // the load slows whatever runs
    others += id != kA;
    if (i % 8 == 7) foldLocal(m);
  }
  CHECK_MSG(others == 0, "%d ops ran another reducer than A", others);
  CHECK(m.choose(4 << 10, kAll, kAll) == kA);
  CHECK(m.switches(0) == 0);
}

TEST(an_unmeasured_incumbent_is_not_replaced_without_evidence) {
  CostModel m = threeReducers();
  observeMany(m, kB, 4 << 10, {1, 1, 1, 1});  // only B measured (ops that named it)
  foldLocal(m);
  CHECK(m.choose(4 << 10, kAll, kAll) == kA);
}

// Runs `ops` auto ops of `bytes` as the executor would: pick, time (the
// reducer's true cost times a load factor that comes and goes), record, and
// fold every 8 ops. Returns the reducer each op ran.
std::vector<ReducerId> runOnline(CostModel& m, size_t bytes, const std::vector<double>& true_us, int ops) {
  std::vector<ReducerId> ran;
  for (int i = 0; i < ops; ++i) {
    const ReducerId id = m.pickForRun(bytes, kAll, kAll);
    const double load = (i / 16) % 2 == 0 ? 1.0 : 1.8;  // bursts of load
    m.observe(id, bytes, true_us[id] * load * (1 + 0.05 * (i % 3)) * kUs);
    ran.push_back(id);
    if (i % 8 == 7) foldLocal(m);
  }
  return ran;
}

TEST(online_refinement_switches_to_a_reducer_that_proves_faster) {
  CostModel m = threeReducers();
  const size_t bytes = size_t(16) << 20;
  // The priors pick A; B is really 40% faster, C slower.
  const std::vector<ReducerId> ran = runOnline(m, bytes, {10000, 6000, 20000}, 400);
  CHECK(ran.front() == kA);
  CHECK(m.choose(bytes, kAll, kAll) == kB);
  CHECK_MSG(m.switches(SizeBands::of(bytes)) == 1, "%d switches", m.switches(SizeBands::of(bytes)));
  // Exploration was sparing: C ran only its kExploreSamples times.
  int c_runs = 0;
  for (ReducerId id : ran) c_runs += id == kC;
  CHECK_MSG(c_runs == CostModel::kExploreSamples, "C ran %d times", c_runs);
  // And the last half of the ops all ran B.
  for (size_t i = ran.size() / 2; i < ran.size(); ++i) CHECK(ran[i] == kB);
}

TEST(online_refinement_does_not_oscillate_between_near_ties) {
  // A and B within a few percent, under load that comes and goes: the
  // choice may change at most once, never back and forth.
  for (const auto& costs : {std::vector<double>{1000, 980, 5000}, std::vector<double>{1000, 1030, 5000}}) {
    CostModel m = threeReducers();
    const std::vector<ReducerId> ran = runOnline(m, 1 << 20, costs, 600);
    int changes = 0;
    ReducerId last = kAutoReducer;
    for (size_t i = 0; i < ran.size(); ++i) {
      // Exploring ops are not choices; skip the first ones (exploration).
      if (i < 64) continue;
      if (last != kAutoReducer && ran[i] != last) ++changes;
      last = ran[i];
    }
    CHECK_MSG(changes == 0, "the choice changed %d times after exploration", changes);
    CHECK(m.switches(SizeBands::of(1 << 20)) <= 1);
  }
}

TEST(ranks_end_with_the_same_model_when_their_timings_differ) {
  // Three ranks whose local timings disagree on the winner. After agree()
  // every rank holds the same estimates and choices: per reducer, the time
  // of the rank that measured it fastest (the one that did not wait).
  constexpr int kRanks = 3;
  std::vector<std::vector<ReducerId>> choices(kRanks);
  std::vector<std::vector<double>> estimates(kRanks);
  runRanks(kRanks, [&](Context& ctx) {
    ReducerEnv env;  // no shared memory: ring, central, native (not a candidate: no native collectives)
    ReducerSet set(env);
    const ReducerId ring = parseReducer("ring"), central = parseReducer("central");
    for (int band = 0; band < SizeBands::kCount; ++band) {
      const size_t bytes = SizeBands::bytes(band);
      for (int k = 0; k < 8; ++k) {
        // Locally, rank 0 sees ring win; ranks 1 and 2 see central win.
        set.record(ring, bytes, (ctx.rank() == 0 ? 100 : 600) * kUs * (band + 1));
        set.record(central, bytes, (ctx.rank() == 1 ? 250 : 500) * kUs * (band + 1));
      }
    }
    set.agree(ctx);  // names ring the challenger where the priors chose central
    for (int band = 0; band < SizeBands::kCount; ++band)
      for (int k = 0; k < CostModel::kExploreSamples; ++k)  // its confirmation
        set.record(ring, SizeBands::bytes(band), (ctx.rank() == 0 ? 100 : 600) * kUs * (band + 1));
    set.agree(ctx);
    const CostModel m = set.model();
    for (int band = 0; band < SizeBands::kCount; ++band) {
      choices[ctx.rank()].push_back(set.choose(ctx, SizeBands::bytes(band), DataType::kFloat32, ReduceOp::kSum));
      estimates[ctx.rank()].push_back(m.measured(band, ring));
      estimates[ctx.rank()].push_back(m.measured(band, central));
    }
  });
  for (int r = 1; r < kRanks; ++r) {
    CHECK_MSG(choices[r] == choices[0], "rank %d chooses differently from rank 0", r);
    CHECK_MSG(estimates[r] == estimates[0], "rank %d's estimates differ from rank 0's", r);
  }
  // Min over ranks: ring 100, central 250 (x band): ring wins everywhere.
  for (ReducerId id : choices[0]) CHECK(std::string(reducerName(id)) == "ring");
  CHECK_MSG(std::abs(estimates[0][0] - 100 * kUs) < 1e-12 && std::abs(estimates[0][1] - 250 * kUs) < 1e-12,
            "ring %g central %g", estimates[0][0], estimates[0][1]);
}

TEST(engine_ranks_run_the_same_reducers_while_the_model_learns) {
  // Two engines over in-process links: a few hundred auto all-reduces at
  // three sizes (exploration and folds through the executor). A rank that
  // ran another reducer than its peer would deadlock or sum wrongly; at the
  // end both hold the same choices.
  test::Cluster c(2);
  std::vector<std::vector<ReducerId>> choices(2);
  c.onEveryRank([&](int rank, Engine& e) {
    for (int i = 0; i < 120; ++i) {
      for (int64_t n : {int64_t(100), int64_t(5000), int64_t(300000)}) {
        auto t = test::floats(std::vector<float>(static_cast<size_t>(n), float(rank + 1)));
        const std::string err = test::finish(e, test::sumOf(e, "auto." + std::to_string(n), t));
        CHECK_MSG(err.empty(), "rank %d op %d size %lld: %s", rank, i, (long long)n, err.c_str());
        if (!err.empty()) return;
        const std::vector<float> got = test::valuesOf(t);
        CHECK_MSG(got.front() == 3.0f && got.back() == 3.0f, "rank %d size %lld: %f", rank, (long long)n, got.front());
      }
    }
    for (int band = 0; band < SizeBands::kCount; ++band)
      choices[rank].push_back(
          e.reducers().choose(e.dataContext(), SizeBands::bytes(band), DataType::kFloat32, ReduceOp::kSum));
  });
  CHECK(choices[0] == choices[1]);
  const CostModel m = c.engines[0]->reducers().model();
  uint32_t seen = 0;
  for (size_t id = 0; id < m.reducers(); ++id) seen += m.samples(SizeBands::of(300000 * 4), static_cast<ReducerId>(id));
  CHECK_MSG(seen == 120, "the 1.2 MB band recorded %u ops, expected 120", seen);
}

// ---- across hosts: the link in the priors (link_cost.h) ------------------------------------------------

namespace {

Context contextOn(int rank, const std::vector<int>& hosts) {
  return Context(Topology::build(rank, hosts), nullptr, nullptr, nullptr, std::chrono::milliseconds(1000));
}

bool near(double a, double b) { return std::abs(a - b) < 1e-12; }

}  // namespace

TEST(each_reducer_states_the_bytes_it_puts_on_a_host_link) {
  const Context two_by_two = contextOn(0, {0, 0, 1, 1});
  // A flat ring over 4 ranks: one edge leaves each host, 2(p-1)/p = 1.5 of the buffer on it, 6 steps.
  const LinkTraffic ring = RingAllreduce().linkTraffic(two_by_two);
  CHECK_MSG(near(ring.bytes_per_byte, 1.5) && near(ring.messages, 6), "ring %g %g", ring.bytes_per_byte, ring.messages);
  // Hosts interleaved (ranks 0 2 on one host): every edge crosses, two leave each host.
  const LinkTraffic interleaved = RingAllreduce().linkTraffic(contextOn(0, {0, 1, 0, 1}));
  CHECK_MSG(near(interleaved.bytes_per_byte, 3.0), "interleaved ring %g", interleaved.bytes_per_byte);
  // The node reducer: 2(H-1)/H = 1 of the buffer, whatever the local size, and a crossing per 4 MiB chunk.
  const LinkTraffic node = NodeAllreduce(NodeOptions{"unused", size_t(4) << 20, {}, nullptr}).linkTraffic(two_by_two);
  CHECK_MSG(near(node.bytes_per_byte, 1.0) && near(node.messages, 2) &&
                near(node.messages_per_byte, 2.0 / double(size_t(4) << 20)),
            "node %g %g %g", node.bytes_per_byte, node.messages, node.messages_per_byte);
  // One parameter server on host 0: it sends the buffer back to both ranks of host 1, host 1 sends two.
  const LinkTraffic central = CentralAllreduce().linkTraffic(two_by_two);
  CHECK_MSG(near(central.bytes_per_byte, 2.0), "central %g", central.bytes_per_byte);
  // One host: nothing crosses.
  const Context one_host = contextOn(1, {0, 0, 0});
  CHECK(RingAllreduce().linkTraffic(one_host).bytes_per_byte == 0);
  CHECK(CentralAllreduce().linkTraffic(one_host).bytes_per_byte == 0);
  // And the seconds: 10 MB/s and 1 ms per crossing, 1 MB through the ring.
  const LinkCost link{1e-3, 1e-7};
  CHECK_MSG(near(linkSeconds(link, ring, 1000000), 6e-3 + 0.15), "%g", linkSeconds(link, ring, 1000000));
  CHECK(linkSeconds(LinkCost{}, ring, 1000000) == 0);
}

TEST(link_priors_start_each_band_on_the_reducer_that_sends_least) {
  // A is the registry's cheapest and crosses the link twice, but sends 3x the buffer over it; B crosses
  // ten times and sends 1x; C six times, 1.5x. Over 1 GB/s with 50 us per crossing, A's fewer crossings
  // win small messages and B's fewer bytes large ones.
  CostModel m = threeReducers();
  const LinkCost link{50e-6, 1e-9};
  m.setLinkPriors(link, {2 * link.latency, 10 * link.latency, 6 * link.latency},
                  {3.0 * link.seconds_per_byte, 1.0 * link.seconds_per_byte, 1.5 * link.seconds_per_byte});
  CHECK(m.choose(4 << 10, kAll, kAll) == kA);
  CHECK(m.choose(1 << 20, kAll, kAll) == kB);
  CHECK(m.choose(size_t(256) << 20, kAll, kAll) == kB);
  CHECK(near(m.prior(kC, 1 << 20), 30 * kUs + 3e-9 * (1 << 20) + 6 * link.latency + 1.5e-9 * (1 << 20)));
}

TEST(across_hosts_a_reducer_the_link_makes_much_slower_is_not_explored) {
  // B sends the least; C 1.2x B's bytes (near: explored), A 2x (spared).
  CostModel m = threeReducers();
  const LinkCost link{20e-6, 1e-7};
  m.setLinkPriors(link, {0, 0, 0}, {2.0e-7, 1.0e-7, 1.2e-7});
  const size_t bytes = 1 << 20;
  const int band = SizeBands::of(bytes);
  for (int op = 0; op < 40; ++op) {
    const ReducerId id = m.pickForRun(bytes, kAll, kAll);
    m.observe(id, bytes, m.prior(id, bytes));
    if (op % 8 == 7) foldLocal(m);
  }
  CHECK_MSG(m.samples(band, kA) == 0, "A, 2x the bytes, ran %u times", m.samples(band, kA));
  CHECK_MSG(m.samples(band, kC) >= uint32_t(CostModel::kExploreSamples), "C, near, ran %u times", m.samples(band, kC));
  CHECK(m.spared(band, kA, kAll) && !m.spared(band, kC, kAll) && !m.spared(band, kB, kAll));
  // Without link priors (one host) everything is explored, as before.
  CostModel alone = threeReducers();
  CHECK(!alone.spared(band, kC, kAll) && !alone.spared(band, kB, kAll));
}

HVD_TEST_MAIN()
