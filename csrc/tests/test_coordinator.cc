// The coordinator's decisions, driven directly with hand-made rank messages
// and a hand-moved clock (no threads, no transport, no sleeping): when an op
// is ready, in which order ready ops are answered, the stall warning and the
// timeout with the ranks they name, which shutdown reason wins, and the
// checks made on a complete op (broadcast root, allgather first dimensions).
#include <chrono>
#include <string>
#include <vector>

#include "check.h"
#include "engine/negotiation/coordinator.h"
#include "requests.h"

using namespace hvdtorch;
using hvdtorch::test::joinRequest;
using std::chrono::milliseconds;

namespace {

Request allreduce(const std::string& name, int64_t n = 4) { return hvdtorch::test::allreduceRequest(name, n); }

Request broadcast(const std::string& name, int32_t root) { return hvdtorch::test::broadcastRequest(name, root); }

// A reduce to `root` with reduce op `op`.
Request reduce(const std::string& name, int32_t root, ReduceOp op = ReduceOp::kSum) {
  Request q = hvdtorch::test::request(OpType::kReduce, name);
  ReduceToRootArgs args;
  args.reduce.op = op;
  args.root = root;
  q.args = args;
  return q;
}

// Messages for one cycle of `p` ranks, none with anything to say yet.
std::vector<RankMessage> quiet(int p) { return std::vector<RankMessage>(p); }

std::vector<std::string> namesOf(const ResponseList& l) {
  std::vector<std::string> out;
  for (const auto& s : l.responses) out.push_back(s.name);
  return out;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct Fixture {
  explicit Fixture(int p, milliseconds stall = milliseconds(1000), milliseconds timeout = milliseconds(5000))
      : coordinator(p, stall, timeout, [this](const std::string& m) { warnings.push_back(m); }) {}
  ResponseList cycle(const std::vector<RankMessage>& msgs, milliseconds at) {
    return coordinator.process(msgs, cache, t0 + at);
  }
  std::vector<std::string> warnings;
  ResponseCache cache{16};
  Coordinator coordinator;
  Coordinator::Clock::time_point t0 = Coordinator::Clock::now();
};

}  // namespace

TEST(ready_only_once_every_rank_submitted) {
  Fixture f(3);
  auto m = quiet(3);
  m[0].uncached = {allreduce("a")};
  m[2].uncached = {allreduce("a")};
  CHECK(f.cycle(m, milliseconds(0)).responses.empty());
  CHECK(f.cycle(quiet(3), milliseconds(1)).responses.empty());
  m = quiet(3);
  m[1].uncached = {allreduce("a")};
  const ResponseList l = f.cycle(m, milliseconds(2));
  CHECK(namesOf(l) == std::vector<std::string>{"a"});
  CHECK(l.responses.size() == 1 && l.responses[0].error.empty());
  // Answered once: the op is gone from the table.
  CHECK(f.cycle(quiet(3), milliseconds(3)).responses.empty());
}

TEST(ready_ops_are_answered_in_order_of_first_arrival) {
  // Arrival order z, y, x (opposite to the names' order), completed together.
  Fixture f(2);
  auto m = quiet(2);
  m[0].uncached = {allreduce("z"), allreduce("y")};
  f.cycle(m, milliseconds(0));
  m = quiet(2);
  m[0].uncached = {allreduce("x")};
  f.cycle(m, milliseconds(1));
  m = quiet(2);
  m[1].uncached = {allreduce("x"), allreduce("y"), allreduce("z")};
  const ResponseList l = f.cycle(m, milliseconds(2));
  CHECK_MSG(namesOf(l) == (std::vector<std::string>{"z", "y", "x"}), "got %zu responses, first %s", l.responses.size(),
            l.responses.empty() ? "-" : l.responses[0].name.c_str());
}

TEST(cached_op_ready_only_once_every_rank_set_its_bit) {
  Fixture f(3);
  f.cache.put(allreduce("c0"));
  f.cache.put(allreduce("c1"));
  const uint32_t c1 = static_cast<uint32_t>(f.cache.idOf("c1"));
  auto withBit = [&](std::vector<int> ranks) {
    auto m = quiet(3);
    for (int r : ranks) m[r].cache_bits = {uint64_t(1) << c1};
    return m;
  };
  CHECK(f.cycle(withBit({0, 1}), milliseconds(0)).cached_ready.empty());
  CHECK(f.cycle(withBit({2}), milliseconds(1)).cached_ready.empty());  // bits are per cycle, not remembered
  const ResponseList l = f.cycle(withBit({0, 1, 2}), milliseconds(2));
  CHECK(l.cached_ready == std::vector<uint32_t>{c1});
  CHECK(l.responses.empty());
}

TEST(stall_warns_once_then_times_out_naming_the_missing_ranks) {
  Fixture f(3, milliseconds(1000), milliseconds(5000));
  auto m = quiet(3);
  m[0].uncached = {allreduce("late")};
  m[2].uncached = {allreduce("late")};
  CHECK(f.cycle(m, milliseconds(0)).responses.empty());
  f.cycle(quiet(3), milliseconds(999));
  CHECK_MSG(f.warnings.empty(), "warned before the stall time: %s", f.warnings[0].c_str());
  CHECK(f.cycle(quiet(3), milliseconds(1000)).responses.empty());
  CHECK_MSG(f.warnings.size() == 1, "%zu warnings", f.warnings.size());
  if (f.warnings.size() == 1) {
    const std::string& w = f.warnings[0];
    CHECK_MSG(
        contains(w, "allreduce 'late'") && contains(w, "ready on ranks [0, 2]") && contains(w, "missing on ranks [1]"),
        "%s", w.c_str());
  }
  CHECK(f.cycle(quiet(3), milliseconds(4999)).responses.empty());
  CHECK_MSG(f.warnings.size() == 1, "warned again: %zu warnings", f.warnings.size());
  const ResponseList l = f.cycle(quiet(3), milliseconds(5000));
  CHECK(namesOf(l) == std::vector<std::string>{"late"});
  if (l.responses.size() == 1) {
    const std::string& e = l.responses[0].error;
    CHECK_MSG(contains(e, "ranks [1] did not submit it within 5 s") && contains(e, "ranks [0, 2] waited"), "%s",
              e.c_str());
  }
  // Failed once, then forgotten; the late rank's submission starts over.
  CHECK(f.cycle(quiet(3), milliseconds(6000)).responses.empty());
}

TEST(cached_op_stall_and_timeout_name_the_missing_ranks) {
  Fixture f(2, milliseconds(100), milliseconds(300));
  f.cache.put(allreduce("c"));
  auto m = quiet(2);
  m[1].cache_bits = {1};
  f.cycle(m, milliseconds(0));
  f.cycle(m, milliseconds(150));
  CHECK_MSG(f.warnings.size() == 1 && contains(f.warnings[0], "missing on ranks [0]"), "%zu warnings",
            f.warnings.size());
  const ResponseList l = f.cycle(m, milliseconds(300));
  CHECK(l.responses.size() == 1 && contains(l.responses[0].error, "ranks [0] did not submit it"));
}

TEST(a_failing_rank_wins_over_one_stopping_normally) {
  for (bool failing_first : {false, true}) {
    Fixture f(3);
    auto m = quiet(3);
    const int normal = failing_first ? 2 : 0, failing = failing_first ? 0 : 2;
    m[normal].shutdown = true;
    m[failing].shutdown = true;
    m[failing].failure = "rank x: the link broke";
    const ResponseList l = f.cycle(m, milliseconds(0));
    CHECK(l.shutdown);
    CHECK_MSG(l.shutdown_rank == failing && l.shutdown_reason == "rank x: the link broke", "rank %d reason '%s'",
              l.shutdown_rank, l.shutdown_reason.c_str());
  }
  // Two failures: the lowest rank's is reported.
  Fixture f(3);
  auto m = quiet(3);
  m[1].shutdown = m[2].shutdown = true;
  m[1].failure = "first";
  m[2].failure = "second";
  const ResponseList l = f.cycle(m, milliseconds(0));
  CHECK(l.shutdown_rank == 1 && l.shutdown_reason == "first");
  // A normal shutdown alone names its rank and no reason.
  Fixture g(2);
  auto n = quiet(2);
  n[1].shutdown = true;
  const ResponseList k = g.cycle(n, milliseconds(0));
  CHECK(k.shutdown && k.shutdown_rank == 1 && k.shutdown_reason.empty());
}

TEST(mismatch_pairs_each_variant_with_the_ranks_that_sent_it) {
  // Four ranks, three variants, not in contiguous runs of ranks.
  Fixture f(4);
  auto m = quiet(4);
  m[0].uncached = {allreduce("m", 4)};
  m[1].uncached = {allreduce("m", 5)};
  m[2].uncached = {allreduce("m", 4)};
  m[3].uncached = {allreduce("m", 6)};
  const ResponseList l = f.cycle(m, milliseconds(0));
  CHECK(l.responses.size() == 1);
  if (l.responses.size() != 1) return;
  const std::string& e = l.responses[0].error;
  CHECK_MSG(contains(e, "mismatched allreduce 'm' across ranks: shape [4] vs [5]"), "%s", e.c_str());
  CHECK_MSG(contains(e, "ranks [0, 2] submitted allreduce 'm' (float32 [4], Sum)"), "%s", e.c_str());
  CHECK_MSG(contains(e, "ranks [1] submitted allreduce 'm' (float32 [5], Sum)"), "%s", e.c_str());
  CHECK_MSG(contains(e, "ranks [3] submitted allreduce 'm' (float32 [6], Sum)"), "%s", e.c_str());
}

// Any op's root (its payload's rootRank()), checked by the coordinator without naming the op.
TEST(a_root_outside_the_world_is_an_error) {
  for (int root : {-1, 2, 3}) {
    for (const Request& q : {broadcast("b", root), reduce("r", root)}) {
      Fixture f(2);
      auto m = quiet(2);
      for (auto& msg : m) msg.uncached = {q};
      const ResponseList l = f.cycle(m, milliseconds(0));
      CHECK(l.responses.size() == 1);
      if (l.responses.size() == 1)
        CHECK_MSG(contains(l.responses[0].error, strCat(q.name, "': root rank ", root, " is not in [0, 2)")),
                  "root %d: '%s'", root, l.responses[0].error.c_str());
    }
  }
  for (const Request& q : {broadcast("ok", 1), reduce("ok.r", 1)}) {
    Fixture f(2);
    auto m = quiet(2);
    for (auto& msg : m) msg.uncached = {q};
    const ResponseList l = f.cycle(m, milliseconds(0));
    CHECK(l.responses.size() == 1 && l.responses[0].error.empty());
  }
}

TEST(allgather_response_carries_every_ranks_first_dimension) {
  Fixture f(3);
  auto m = quiet(3);
  const std::vector<std::vector<int64_t>> shapes = {{0, 3}, {2, 3}, {5, 3}};
  for (int r = 0; r < 3; ++r) {
    Request q;
    q.type = OpType::kAllgather;
    q.name = "g";
    q.tensors = {{DataType::kInt32, shapes[r]}};
    m[r].uncached = {q};
  }
  const ResponseList l = f.cycle(m, milliseconds(0));
  CHECK(l.responses.size() == 1 && l.responses[0].error.empty());
  if (l.responses.size() == 1 && std::holds_alternative<AllgatherPlan>(l.responses[0].plan))
    CHECK(std::get<AllgatherPlan>(l.responses[0].plan).first_dims == (std::vector<int64_t>{0, 2, 5}));
  else
    CHECK_MSG(false, "no allgather plan in the response");
}

// ---- join --------------------------------------------------------------------

namespace {

Request withOp(Request q, ReduceOp op) {
  std::get<ReduceArgs>(q.args).op = op;
  return q;
}

}  // namespace

TEST(a_joined_rank_stands_in_with_zeros_and_never_times_out) {
  Fixture f(3, milliseconds(100), milliseconds(500));
  auto m = quiet(3);
  m[1].uncached = {joinRequest()};
  m[0].uncached = {allreduce("a")};
  CHECK(f.cycle(m, milliseconds(0)).responses.empty());  // rank 2 has not submitted "a"
  m = quiet(3);
  m[2].uncached = {allreduce("a")};
  ResponseList l = f.cycle(m, milliseconds(1));
  CHECK(namesOf(l) == std::vector<std::string>{"a"});
  if (l.responses.size() == 1) {
    const Response& s = l.responses[0];
    CHECK_MSG(s.error.empty(), "%s", s.error.c_str());
    CHECK(s.joined == std::vector<int32_t>{1});
    CHECK(s.stand_in && s.stand_in->name == "a" && s.stand_in->tensors[0].shape == std::vector<int64_t>{4});
  }
  // Long after the timeout, the join waits on without a warning...
  CHECK(f.cycle(quiet(3), milliseconds(10000)).responses.empty());
  CHECK(f.warnings.empty());
  // ...until the last rank joins: everyone learns who that was.
  m = quiet(3);
  m[0].uncached = {joinRequest()};
  CHECK(f.cycle(m, milliseconds(10001)).responses.empty());
  m = quiet(3);
  m[2].uncached = {joinRequest()};
  l = f.cycle(m, milliseconds(10002));
  CHECK(namesOf(l) == std::vector<std::string>{"hvdtorch.join"});
  if (l.responses.size() == 1 && std::holds_alternative<JoinPlan>(l.responses[0].plan))
    CHECK_MSG(std::get<JoinPlan>(l.responses[0].plan).last_rank == 2, "last %d",
              std::get<JoinPlan>(l.responses[0].plan).last_rank);
  else
    CHECK_MSG(false, "no join plan");
  // Joins are over: "b" waits for every rank again.
  m = quiet(3);
  m[0].uncached = {allreduce("b")};
  m[2].uncached = {allreduce("b")};
  CHECK(f.cycle(m, milliseconds(10003)).responses.empty());
}

TEST(a_cached_op_with_a_joined_rank_gets_a_full_response) {
  Fixture f(2);
  f.cache.put(allreduce("c"));
  const uint32_t id = static_cast<uint32_t>(f.cache.idOf("c"));
  auto m = quiet(2);
  m[0].cache_bits = {uint64_t(1) << id};
  m[1].uncached = {joinRequest()};
  const ResponseList l = f.cycle(m, milliseconds(0));
  CHECK(l.cached_ready.empty());
  CHECK(namesOf(l) == std::vector<std::string>{"c"});
  if (l.responses.size() == 1) CHECK(l.responses[0].joined == std::vector<int32_t>{1} && l.responses[0].stand_in);
}

TEST(a_joined_rank_submits_no_stand_in_ops_itself) {
  Fixture f(3, milliseconds(100), milliseconds(500));
  const std::string own = std::string(kNoStandInPrefix) + "shard";
  auto m = quiet(3);
  m[1].uncached = {joinRequest()};
  m[0].uncached = {allreduce(own)};
  m[2].uncached = {allreduce(own)};
  CHECK(f.cycle(m, milliseconds(0)).responses.empty());  // rank 1 has joined but not submitted it
  m = quiet(3);
  m[1].uncached = {allreduce(own)};
  ResponseList l = f.cycle(m, milliseconds(1));
  CHECK(namesOf(l) == std::vector<std::string>{own});
  if (l.responses.size() == 1) {
    CHECK_MSG(l.responses[0].error.empty(), "%s", l.responses[0].error.c_str());
    CHECK(l.responses[0].joined.empty() && !l.responses[0].stand_in);  // rank 1 took part with its own data
  }
  // The same from cache bits: no stand-in response while rank 1's bit is missing.
  f.cache.put(allreduce(own));
  const uint32_t id = static_cast<uint32_t>(f.cache.idOf(own));
  m = quiet(3);
  m[0].cache_bits = m[2].cache_bits = {uint64_t(1) << id};
  l = f.cycle(m, milliseconds(2));
  CHECK(l.responses.empty() && l.cached_ready.empty());
  m = quiet(3);
  for (auto& msg : m) msg.cache_bits = {uint64_t(1) << id};
  l = f.cycle(m, milliseconds(3));
  CHECK(l.responses.empty() && l.cached_ready == std::vector<uint32_t>{id});
  // An op the joined rank never submits times out naming it; the join itself waits on.
  m = quiet(3);
  m[0].uncached = {allreduce(own + ".late")};
  m[2].uncached = {allreduce(own + ".late")};
  f.cycle(m, milliseconds(10));
  l = f.cycle(quiet(3), milliseconds(600));
  CHECK(namesOf(l) == std::vector<std::string>{own + ".late"});
  if (l.responses.size() == 1)
    CHECK_MSG(contains(l.responses[0].error, "ranks [1] did not submit it"), "%s", l.responses[0].error.c_str());
}

TEST(the_join_is_answered_after_the_ops_it_stood_in_for) {
  Fixture f(2);
  auto m = quiet(2);
  m[0].uncached = {joinRequest()};
  f.cycle(m, milliseconds(0));
  m = quiet(2);
  m[1].uncached = {allreduce("x"), joinRequest()};
  const ResponseList l = f.cycle(m, milliseconds(1));
  CHECK(namesOf(l) == (std::vector<std::string>{"x", "hvdtorch.join"}));
  if (l.responses.size() == 2) CHECK(std::get<JoinPlan>(l.responses[1].plan).last_rank == 1);
}

TEST(allgather_with_a_joined_rank_gets_no_rows_from_it) {
  Fixture f(3);
  auto m = quiet(3);
  m[0].uncached = {joinRequest()};
  for (int r : {1, 2}) {
    Request q;
    q.type = OpType::kAllgather;
    q.name = "g";
    q.tensors = {{DataType::kInt32, {int64_t(r), 3}}};
    m[r].uncached.push_back(q);
  }
  const ResponseList l = f.cycle(m, milliseconds(0));
  CHECK(l.responses.size() == 1 && l.responses[0].error.empty());
  if (l.responses.size() == 1 && std::holds_alternative<AllgatherPlan>(l.responses[0].plan)) {
    CHECK(std::get<AllgatherPlan>(l.responses[0].plan).first_dims == (std::vector<int64_t>{0, 1, 2}));
    CHECK(l.responses[0].stand_in && l.responses[0].stand_in->tensors[0].shape == (std::vector<int64_t>{0, 3}));
  }
}

TEST(ops_a_joined_rank_cannot_stand_in_for_are_errors) {
  Request rs = allreduce("rs");
  rs.type = OpType::kReducescatter;
  Request a2a;
  a2a.type = OpType::kAlltoall;
  a2a.name = "a2a";
  a2a.tensors = {{DataType::kFloat32, {2}}};
  a2a.args = AlltoallArgs{{1, 1}};
  const std::vector<std::pair<Request, std::string>> cases = {
      {withOp(allreduce("mn"), ReduceOp::kMin), "cannot run while ranks [1] have joined"},
      {withOp(allreduce("pr"), ReduceOp::kProduct), "cannot run while ranks [1] have joined"},
      {rs, "cannot run while ranks [1] have joined"},
      {a2a, "cannot run while ranks [1] have joined"},
      {broadcast("bc", 1), "root rank [1] has joined"},
      {reduce("rd", 1), "root rank [1] has joined"},
      {reduce("rd.min", 0, ReduceOp::kMin), "cannot run while ranks [1] have joined"},
  };
  for (const auto& [q, expected] : cases) {
    Fixture f(2);
    auto m = quiet(2);
    m[0].uncached = {q};
    m[1].uncached = {joinRequest()};
    const ResponseList l = f.cycle(m, milliseconds(0));
    CHECK(l.responses.size() == 1);
    if (l.responses.size() == 1)
      CHECK_MSG(contains(l.responses[0].error, expected), "%s: '%s'", q.name.c_str(), l.responses[0].error.c_str());
  }
  // Sum, Average, and a broadcast or a Sum or Average reduce whose root is still in are fine.
  for (const Request& q : {withOp(allreduce("s"), ReduceOp::kSum), withOp(allreduce("av"), ReduceOp::kAverage),
                           broadcast("b0", 0), reduce("r0", 0), reduce("r0.av", 0, ReduceOp::kAverage)}) {
    Fixture f(2);
    auto m = quiet(2);
    m[0].uncached = {q};
    m[1].uncached = {joinRequest()};
    const ResponseList l = f.cycle(m, milliseconds(0));
    CHECK(l.responses.size() == 1 && l.responses[0].error.empty() && l.responses[0].stand_in);
  }
}

HVD_TEST_MAIN()
