// Control messages: every op's request and plan survive the wire; malformed
// frames (truncated anywhere, bad enums, absurd lengths, trailing bytes)
// throw CollectiveError and nothing else; and the coordinator's decisions for
// the ops with payloads (alltoall plans, reduce-scatter splits, mismatches).
#include <string>
#include <vector>

#include "algorithms/reducer_registry.h"
#include "check.h"
#include "common/error.h"
#include "engine/negotiation/coordinator.h"
#include "engine/request.h"
#include "ops/op_table.h"
#include "requests.h"

using namespace hvdtorch;

namespace {

// Every payload field away from its default, so that the wire must carry it.
Request request(OpType type, const std::string& name, std::vector<int64_t> shape) {
  Request q = hvdtorch::test::request(type, name, std::move(shape));
  if (auto* a = std::get_if<ReduceArgs>(&q.args)) {
    a->op = ReduceOp::kMax;
    a->prescale = 2.0;
    a->postscale = 0.25;
    a->reducer = parseReducer("ring");
    a->fuse = false;
  }
  if (auto* b = std::get_if<BroadcastArgs>(&q.args)) b->root = 1;
  if (auto* t = std::get_if<AlltoallArgs>(&q.args)) t->splits = {1, 0, 2};
  if (auto* d = std::get_if<ReduceToRootArgs>(&q.args)) {
    d->reduce.op = ReduceOp::kMin;
    d->reduce.postscale = 0.5;
    d->root = 2;
  }
  return q;
}

std::vector<Request> everyOp() {
  std::vector<Request> out;
  for (OpType t : {OpType::kAllreduce, OpType::kAllgather, OpType::kBroadcast, OpType::kBarrier, OpType::kAlltoall,
                   OpType::kReducescatter, OpType::kReduce})
    out.push_back(request(t, strCat(opTypeName(t), ".x"), {3, 2}));
  return out;
}

// Parsing `bytes` either works or throws CollectiveError, never anything else.
template <typename Parse>
bool parsesOrThrowsCollectiveError(const std::vector<char>& bytes, Parse parse) {
  try {
    parse(bytes);
    return true;
  } catch (const CollectiveError&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

TEST(every_request_and_plan_round_trips) {
  RankMessage m;
  m.cache_bits = {5};
  m.uncached = everyOp();
  m.uncached[0].process_set_id = 0;
  const RankMessage back = RankMessage::parse(m.serialize());
  CHECK(back.uncached.size() == m.uncached.size());
  for (size_t i = 0; i < m.uncached.size(); ++i) {
    CHECK(back.uncached[i].name == m.uncached[i].name);
    CHECK(back.uncached[i].args.index() == m.uncached[i].args.index());
    CHECK(Request::signatureMismatch(back.uncached[i], m.uncached[i]).empty());
  }
  CHECK(back.uncached[4].payload<AlltoallArgs>().splits == (std::vector<int64_t>{1, 0, 2}));
  CHECK(back.uncached[6].payload<ReduceToRootArgs>().root == 2 &&
        back.uncached[6].payload<ReduceToRootArgs>().reduce.op == ReduceOp::kMin &&
        back.uncached[6].payload<ReduceToRootArgs>().reduce.postscale == 0.5);
  CHECK(back.uncached[0].payload<ReduceArgs>().reducer == parseReducer("ring") &&
        !back.uncached[0].payload<ReduceArgs>().fuse);

  ResponseList l;
  Response a;
  a.type = OpType::kAlltoall;
  a.name = "a";
  a.plan = AlltoallPlan{{1, 2, 3, 4}};
  Response g;
  g.type = OpType::kAllgather;
  g.name = "g";
  g.plan = AllgatherPlan{{7, 8}};
  Response s;
  s.type = OpType::kReducescatter;
  s.name = "s";
  s.plan = ReducescatterPlan{{2, 1}};
  Response e;
  e.type = OpType::kAlltoall;
  e.name = "e";
  e.error = "no";  // error responses carry no plan
  Response j;
  j.type = OpType::kJoin;
  j.name = "hvdtorch.join";
  j.plan = JoinPlan{3};
  g.joined = {0, 2};  // ranks that joined stand in with no rows
  Request stand_in;
  stand_in.type = OpType::kAllgather;
  stand_in.name = "g";
  stand_in.tensors = {{DataType::kFloat16, {0, 5}}};
  g.stand_in = stand_in;
  l.responses = {a, g, s, e, j};
  const ResponseList lb = ResponseList::parse(l.serialize());
  CHECK(std::get<JoinPlan>(lb.responses[4].plan).last_rank == 3);
  CHECK(lb.responses[1].joined == (std::vector<int32_t>{0, 2}) && !lb.responses[0].stand_in);
  CHECK(lb.responses[1].stand_in && lb.responses[1].stand_in->tensors[0].shape == (std::vector<int64_t>{0, 5}) &&
        lb.responses[1].stand_in->tensors[0].dtype == DataType::kFloat16);
  CHECK(std::get<AlltoallPlan>(lb.responses[0].plan).splits == (std::vector<int64_t>{1, 2, 3, 4}));
  CHECK(std::get<AllgatherPlan>(lb.responses[1].plan).first_dims == (std::vector<int64_t>{7, 8}));
  CHECK(std::get<ReducescatterPlan>(lb.responses[2].plan).rows == (std::vector<int64_t>{2, 1}));
  CHECK(lb.responses[3].error == "no" && lb.responses[3].plan.index() == 0);
}

TEST(malformed_frames_throw_collective_error) {
  RankMessage m;
  m.uncached = everyOp();
  const std::vector<char> good = m.serialize();
  // Cut anywhere: every prefix is rejected cleanly.
  for (size_t n = 0; n < good.size(); ++n) {
    std::vector<char> cut(good.begin(), good.begin() + n);
    CHECK_MSG(parsesOrThrowsCollectiveError(cut, RankMessage::parse), "prefix of %zu bytes", n);
    bool threw = false;
    try {
      RankMessage::parse(cut);
    } catch (const CollectiveError&) {
      threw = true;
    }
    CHECK_MSG(threw, "prefix of %zu bytes parsed", n);
  }
  // Every single byte corrupted: parses or throws CollectiveError, never crashes or throws otherwise.
  for (size_t i = 0; i < good.size(); ++i) {
    for (char v : {char(0xff), char(0x7f), char(0x06)}) {
      std::vector<char> bad = good;
      bad[i] = v;
      CHECK_MSG(parsesOrThrowsCollectiveError(bad, RankMessage::parse), "byte %zu = %d", i, int(v));
    }
  }
  std::vector<char> trailing = good;
  trailing.push_back(0);
  CHECK_THROWS(RankMessage::parse(trailing), CollectiveError);

  // The op-type byte of the first request: past the last op of the table.
  ByteWriter w;
  w.put<uint8_t>(0);  // shutdown
  w.putString("");    // failure
  w.putVector(std::vector<uint64_t>{});
  w.put<uint32_t>(1);                                      // one request
  w.put<uint8_t>(static_cast<uint8_t>(opTable().size()));  // op type
  CHECK_THROWS(RankMessage::parse(w.bytes()), CollectiveError);

  // A vector claiming 2^32 - 1 elements must not allocate them.
  ByteWriter big;
  big.put<uint8_t>(0);
  big.putString("");
  big.put<uint32_t>(0xffffffffu);
  CHECK_THROWS(RankMessage::parse(big.bytes()), CollectiveError);
}

// The wire check follows the op table: every row at its enum value, the
// last op accepted, the first value past the table rejected by name.
TEST(op_table_is_in_enum_order_and_bounds_the_wire_check) {
  const auto& table = opTable();
  for (size_t v = 0; v < table.size(); ++v) CHECK_MSG(static_cast<size_t>(table[v].type) == v, "row %zu", v);
  CHECK(findOpSpec(static_cast<uint8_t>(table.size())) == nullptr);
  const OpType last = table.back().type;
  ByteWriter w;
  request(last, "last", {1}).write(w);
  std::vector<char> bytes = w.bytes();
  ByteReader ok(bytes.data(), bytes.size());
  CHECK(Request::read(ok).type == last);
  bytes[0] = static_cast<char>(table.size());
  ByteReader past(bytes.data(), bytes.size());
  std::string error;
  try {
    Request::read(past);
  } catch (const CollectiveError& e) {
    error = e.what();
  }
  CHECK_MSG(error.find("op type") != std::string::npos, "got '%s'", error.c_str());
}

// The engine reads the table ops hand it (useOpTable, engine/op_spec.h):
// ops' table is the one in use here (requests.h hands it over), handing it
// again is fine, and a table out of enum order, short of a row, or another
// table once one is in use is refused.
TEST(op_table_is_handed_over_by_ops) {
  CHECK(&opTable() == &ops::opTable());
  useOpTable(ops::opTable());
  std::vector<OpSpec> swapped = ops::opTable();
  std::swap(swapped[0], swapped[1]);
  CHECK_THROWS(useOpTable(swapped), InvalidArgument);
  std::vector<OpSpec> short_of_one = ops::opTable();
  short_of_one.pop_back();
  CHECK_THROWS(useOpTable(short_of_one), InvalidArgument);
  const std::vector<OpSpec> copy = ops::opTable();
  CHECK_THROWS(useOpTable(copy), InvalidArgument);
  CHECK(&opTable() == &ops::opTable());
}

TEST(coordinator_plans_payload_ops) {
  const int p = 3;
  Coordinator coord(p, std::chrono::seconds(60), std::chrono::seconds(60), [](const std::string&) {});
  ResponseCache cache(16);
  std::vector<RankMessage> msgs(p);
  for (int r = 0; r < p; ++r) {
    Request a = request(OpType::kAlltoall, "a2a", {r + 1, 2});  // first dimensions differ: allowed
    std::vector<int64_t> splits(p, 0);
    splits[(r + 1) % p] = r + 1;
    a.args = AlltoallArgs{splits};
    Request s = request(OpType::kReducescatter, "rs", {7, 2});
    Request bad = request(OpType::kAlltoall, "trailing", {3, r == 2 ? 3 : 2});
    bad.args = AlltoallArgs{{1, 1, 1}};
    msgs[r].uncached = {a, s, bad};
  }
  const ResponseList l = coord.process(msgs, cache, Coordinator::Clock::now());
  CHECK(l.responses.size() == 3);
  for (const Response& s : l.responses) {
    if (s.name == "a2a") {
      CHECK_MSG(s.error.empty(), "%s", s.error.c_str());
      CHECK(std::get<AlltoallPlan>(s.plan).splits == (std::vector<int64_t>{0, 1, 0, 0, 0, 2, 3, 0, 0}));
    } else if (s.name == "rs") {
      CHECK(std::get<ReducescatterPlan>(s.plan).rows == (std::vector<int64_t>{3, 2, 2}));
    } else {
      CHECK(s.error.find("mismatched alltoall 'trailing'") != std::string::npos);
      CHECK(s.error.find("ranks [0, 1]") != std::string::npos && s.error.find("ranks [2]") != std::string::npos);
    }
  }
  // Splits that do not fit the tensor (a peer that skipped its own checks)
  // become an error response, not a crash of the executors.
  std::vector<RankMessage> odd(p);
  for (int r = 0; r < p; ++r) {
    Request a = request(OpType::kAlltoall, "odd", {2, 2});
    a.args = AlltoallArgs{{r == 1 ? 5 : 1, 1, 0}};
    odd[r].uncached = {a};
  }
  const ResponseList lo = coord.process(odd, cache, Coordinator::Clock::now());
  CHECK(lo.responses.size() == 1 &&
        lo.responses[0].error.find("rank 1 submitted splits [5, 1, 0]") != std::string::npos);
}

TEST(process_set_is_part_of_the_signature) {
  Request a = request(OpType::kAllreduce, "x", {2});
  Request b = a;
  b.process_set_id = 1;
  CHECK(Request::signatureMismatch(a, b).find("process set 0 vs 1") != std::string::npos);
}

HVD_TEST_MAIN()
