// Process sets through the engine, 4 in-process ranks: every op kind on
// overlapping sets submitted in rank-dependent orders (ranks in two sets
// must never wait on each other), broadcast roots given as global ranks,
// errors naming the set and global ranks, and adding/removing sets.
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "cluster.h"
#include "common/error.h"
#include "engine/tensor.h"
#include "ops/allgather.h"
#include "ops/allreduce.h"
#include "ops/barrier.h"
#include "ops/broadcast.h"
#include "submit.h"

using namespace hvdtorch;
using hvdtorch::test::Cluster;
using hvdtorch::test::finish;
using hvdtorch::test::floats;
using hvdtorch::test::sumOf;
using hvdtorch::test::valuesOf;

namespace {

// Every rank adds the same sets in the same order, as hvdtorch.add_process_set does.
std::vector<int32_t> addSets(Cluster& c, const std::vector<std::vector<int>>& sets) {
  std::vector<std::vector<int32_t>> ids(c.engines.size());
  c.onEveryRank([&](int r, Engine& eng) {
    for (const auto& s : sets) ids[r].push_back(eng.addProcessSet(s));
  });
  for (const auto& v : ids) CHECK(v == ids[0]);
  return ids[0];
}

}  // namespace

TEST(overlapping_sets_in_rank_dependent_order) {
  Cluster c(4);
  const auto ids = addSets(c, {{0, 1}, {3, 1, 2}});  // any order in, ascending inside
  CHECK(ids == (std::vector<int32_t>{1, 2}));
  const int32_t a = ids[0], b = ids[1];
  c.onEveryRank([&](int r, Engine& eng) {
    // Rank 1 is in both sets and submits b's ops first; the others the other
    // way round. Several rounds, so the response cache path runs too.
    for (int round = 0; round < 4; ++round) {
      std::vector<std::pair<int64_t, TensorPtr>> hs;
      std::vector<float> want;
      auto submitA = [&] {
        if (r > 1) return;
        auto t = floats({float(r + 1), 10.f * round});
        hs.push_back({sumOf(eng, "a.x", t, a), t});
        want.insert(want.end(), {3.f, 20.f * round});  // ranks 0 and 1: 1 + 2
      };
      auto submitB = [&] {
        if (r < 1) return;
        auto t = floats({float(r + 1), 1.f});
        hs.push_back({sumOf(eng, "b.x", t, b), t});
        want.insert(want.end(), {9.f, 3.f});  // ranks 1, 2, 3: 2 + 3 + 4
      };
      if (r == 1) {
        submitB();
        submitA();
      } else {
        submitA();
        submitB();
      }
      std::vector<float> got;
      for (auto& [h, t] : hs) {
        CHECK_MSG(finish(eng, h).empty(), "rank %d round %d", r, round);
        for (float v : valuesOf(t)) got.push_back(v);
      }
      CHECK_MSG(got == want, "rank %d round %d", r, round);
    }
    // The same name in two sets at once is fine: names are per set.
    if (r == 1) {
      auto x = floats({1.f}), y = floats({1.f});
      const int64_t h1 = sumOf(eng, "same", x, a), h2 = sumOf(eng, "same", y, b);
      CHECK(finish(eng, h1).empty() && finish(eng, h2).empty());
      CHECK(valuesOf(x)[0] == 2.f && valuesOf(y)[0] == 3.f);
    } else {
      auto x = floats({1.f});
      CHECK(finish(eng, sumOf(eng, "same", x, r == 0 ? a : b)).empty());
    }
  });
}

TEST(broadcast_root_is_a_global_rank_and_allgather_spans_the_set) {
  Cluster c(4);
  const int32_t s = addSets(c, {{1, 3}})[0];
  c.onEveryRank([&](int r, Engine& eng) {
    if (r != 1 && r != 3) return;
    ops::BroadcastOptions bo;
    bo.name = "bc";
    bo.input = bo.output = floats({float(r), float(r)});
    bo.root = 3;  // global rank 3 = set rank 1
    bo.process_set_id = s;
    auto out = bo.output;
    CHECK(finish(eng, ops::broadcast(eng, std::move(bo))).empty());
    CHECK_MSG(valuesOf(out) == (std::vector<float>{3.f, 3.f}), "rank %d", r);

    ops::AllgatherOptions go;
    go.name = "ag";
    go.inputs = {floats(std::vector<float>(r == 1 ? 1 : 2, float(r)))};
    go.allocate = [](DataType dt, const std::vector<int64_t>& shape) {
      return std::make_shared<HostTensor>(dt, shape);
    };
    go.process_set_id = s;
    const int64_t h = ops::allgather(eng, std::move(go));
    auto st = eng.state(h);
    CHECK(st->waitFor(std::chrono::milliseconds(20000)) && st->error().empty());
    CHECK_MSG(valuesOf(st->outputs()[0]) == (std::vector<float>{1.f, 3.f, 3.f}), "rank %d", r);
    eng.release(h);

    ops::BarrierOptions ba;
    ba.name = "sb";
    ba.process_set_id = s;
    CHECK(finish(eng, ops::barrier(eng, std::move(ba))).empty());
  });
}

TEST(set_errors_name_the_set_and_global_ranks) {
  Cluster c(4);
  const int32_t s = addSets(c, {{0, 2, 3}})[0];
  // Not a member, unknown id, root outside the set: local errors.
  CHECK_THROWS(sumOf(*c.engines[1], "x", floats({1.f}), s), InvalidArgument);
  try {
    sumOf(*c.engines[1], "x", floats({1.f}), s);
  } catch (const InvalidArgument& e) {
    CHECK_MSG(std::string(e.what()).find("process set 1 [0, 2, 3] does not include this rank") != std::string::npos,
              "%s", e.what());
  }
  CHECK_THROWS(sumOf(*c.engines[0], "x", floats({1.f}), 7), InvalidArgument);
  ops::BroadcastOptions bo;
  bo.name = "bc";
  bo.input = bo.output = floats({1.f});
  bo.root = 1;
  bo.process_set_id = s;
  CHECK_THROWS(ops::broadcast(*c.engines[0], std::move(bo)), InvalidArgument);
  // A mismatch inside the set names the set and the members' global ranks.
  std::vector<std::string> errors(4);
  c.onEveryRank([&](int r, Engine& eng) {
    if (r == 1) return;
    errors[r] = finish(eng, sumOf(eng, "m", floats(std::vector<float>(r == 3 ? 2 : 1, 1.f)), s));
  });
  for (int r : {0, 2, 3}) {
    CHECK_MSG(errors[r].find("mismatched allreduce 'm' across ranks of process set 1 [0, 2, 3]") != std::string::npos,
              "rank %d: %s", r, errors[r].c_str());
    CHECK_MSG(errors[r].find("ranks [0, 2] submitted") != std::string::npos &&
                  errors[r].find("ranks [3] submitted") != std::string::npos,
              "rank %d: %s", r, errors[r].c_str());
  }
}

TEST(missing_member_times_out_naming_global_ranks) {
  Config cfg;
  Cluster c(4, cfg);  // 5 s timeout
  const int32_t s = addSets(c, {{1, 2, 3}})[0];
  std::vector<std::string> errors(4);
  c.onEveryRank([&](int r, Engine& eng) {
    if (r == 1 || r == 3) errors[r] = finish(eng, sumOf(eng, "lonely", floats({1.f}), s));
  });
  for (int r : {1, 3})
    CHECK_MSG(errors[r].find("in process set 1 [1, 2, 3]: ranks [2] did not submit it") != std::string::npos,
              "rank %d: %s", r, errors[r].c_str());
}

TEST(add_and_remove) {
  Cluster c(3);
  Engine& e0 = *c.engines[0];
  CHECK_THROWS(e0.addProcessSet({}), InvalidArgument);
  CHECK_THROWS(e0.addProcessSet({0, 0}), InvalidArgument);
  CHECK_THROWS(e0.addProcessSet({0, 3}), InvalidArgument);
  CHECK_THROWS(e0.addProcessSet({2, 1, 0}), InvalidArgument);  // the global set's ranks
  CHECK_THROWS(e0.removeProcessSet(0), InvalidArgument);
  CHECK_THROWS(e0.removeProcessSet(5), InvalidArgument);
  auto ids = addSets(c, {{0, 1}, {1, 2}});
  CHECK(ids == (std::vector<int32_t>{1, 2}));
  CHECK_THROWS(e0.addProcessSet({1, 0}), InvalidArgument);  // same ranks as set 1
  c.onEveryRank([&](int, Engine& eng) { eng.removeProcessSet(1); });
  CHECK(e0.processSet(1) == nullptr);
  CHECK_THROWS(sumOf(e0, "gone", floats({1.f}), 1), InvalidArgument);
  // The smallest free id is reused.
  CHECK(addSets(c, {{0, 2}}) == (std::vector<int32_t>{1}));
  CHECK(e0.processSets().size() == 3);
  // A set with an op in flight on this rank cannot be removed.
  auto t = floats({1.f});
  const int64_t h = sumOf(*c.engines[1], "inflight", t, 2);
  CHECK_THROWS(c.engines[1]->removeProcessSet(2), InvalidArgument);
  auto t2 = floats({1.f});
  CHECK(finish(*c.engines[2], sumOf(*c.engines[2], "inflight", t2, 2)).empty());
  CHECK(finish(*c.engines[1], h).empty());
  c.engines[1]->removeProcessSet(2);
}

HVD_TEST_MAIN()
