// Fusion planning on its own: which ready all-reduces share a collective.
// A unit grows while the next tensor still fits under the threshold (equal
// fits), tensors fuse only when dtype, reduce op, both scale factors, reducer
// and the fuse flag agree, anything else (another collective, a failed
// negotiation) closes the open unit, and a grouped op's tensors stay together
// and count their pieces.
#include <string>
#include <vector>

#include "check.h"
#include "engine/negotiation/fusion_plan.h"
#include "ops/op_table.h"

using namespace hvdtorch;

namespace {

// Fusion planning reads the op table in use, which an Engine would hand
// over (engine/op_spec.h); these tests plan without one.
[[maybe_unused]] const bool kOpTableInUse = (useOpTable(ops::opTable()), true);

// An all-reduce of `n` float32 (4n bytes) with its ready response.
ReadyOp op(const std::string& name, int64_t n, ReduceOp rop = ReduceOp::kSum) {
  auto e = std::make_shared<Entry>();
  e->request.type = OpType::kAllreduce;
  e->request.name = name;
  e->request.tensors = {{DataType::kFloat32, {n}}};
  ReduceArgs args;
  args.op = rop;
  e->request.args = args;
  Response s;
  s.type = OpType::kAllreduce;
  s.name = name;
  return {s, e};
}

ReduceArgs& argsOf(Request& q) { return std::get<ReduceArgs>(q.args); }

std::vector<WorkUnit> plan(std::vector<ReadyOp> ready, size_t threshold) { return planWork(ready, threshold); }

// Unit sizes, in pieces.
std::vector<size_t> shape(const std::vector<WorkUnit>& units) {
  std::vector<size_t> out;
  for (const auto& u : units) out.push_back(u.pieces.size());
  return out;
}

std::string str(const std::vector<size_t>& v) {
  std::string s;
  for (size_t x : v) s += std::to_string(x) + " ";
  return s;
}

}  // namespace

TEST(units_grow_up_to_the_threshold) {
  // 100-byte tensors: 250 holds two; 300 holds exactly three.
  std::vector<ReadyOp> ready;
  for (int i = 0; i < 5; ++i) ready.push_back(op("t" + std::to_string(i), 25));
  auto units = plan(ready, 250);
  CHECK_MSG(shape(units) == (std::vector<size_t>{2, 2, 1}), "threshold 250: %s", str(shape(units)).c_str());
  CHECK(units.size() == 3 && units[0].bytes == 200 && units[2].bytes == 100);
  units = plan(ready, 300);
  CHECK_MSG(shape(units) == (std::vector<size_t>{3, 2}), "threshold 300: %s", str(shape(units)).c_str());
  // Threshold 0: no fusion at all; a tensor above the threshold runs alone.
  CHECK(shape(plan(ready, 0)) == (std::vector<size_t>{1, 1, 1, 1, 1}));
  std::vector<ReadyOp> mixed = {op("small", 10), op("huge", 1000), op("small2", 10)};
  CHECK(shape(plan(mixed, 200)) == (std::vector<size_t>{1, 1, 1}));
  // Every piece in order, each unit an all-reduce.
  units = plan(ready, 1 << 20);
  CHECK(units.size() == 1);
  for (size_t i = 0; i < ready.size() && units.size() == 1; ++i)
    CHECK(units[0].pieces[i].entry == ready[i].entry && units[0].type == OpType::kAllreduce);
}

TEST(only_matching_signatures_fuse) {
  auto pair = [](auto change) {
    std::vector<ReadyOp> ready = {op("a", 4), op("b", 4)};
    change(ready[1].entry->request);
    return plan(ready, 1 << 20).size();
  };
  CHECK(pair([](Request&) {}) == 1);
  CHECK_MSG(pair([](Request& q) { argsOf(q).op = ReduceOp::kMax; }) == 2, "Sum and Max fused");
  CHECK_MSG(pair([](Request& q) { argsOf(q).op = ReduceOp::kAverage; }) == 2, "Sum and Average fused");
  CHECK_MSG(pair([](Request& q) { q.tensors[0].dtype = DataType::kFloat64; }) == 2, "float32 and float64 fused");
  CHECK_MSG(pair([](Request& q) { argsOf(q).prescale = 2.0; }) == 2, "different prescales fused");
  CHECK_MSG(pair([](Request& q) { argsOf(q).postscale = 0.5; }) == 2, "different postscales fused");
  CHECK_MSG(pair([](Request& q) { argsOf(q).reducer = 0; }) == 2, "different reducers fused");
  CHECK_MSG(pair([](Request& q) { argsOf(q).fuse = false; }) == 2, "an op with fusion off was fused");
  // Fusion off on the first op: it stays alone too.
  std::vector<ReadyOp> ready = {op("a", 4), op("b", 4), op("c", 4)};
  argsOf(ready[0].entry->request).fuse = false;
  CHECK(shape(plan(ready, 1 << 20)) == (std::vector<size_t>{1, 2}));
}

TEST(other_collectives_and_failed_negotiations_are_units_of_their_own) {
  std::vector<ReadyOp> ready = {op("a", 4), op("bad", 4), op("c", 4), op("bcast", 4), op("d", 4)};
  ready[1].response.error = "mismatched allreduce 'bad'";
  ready[3].response.type = OpType::kBroadcast;
  ready[3].entry->request.type = OpType::kBroadcast;
  ready[3].entry->request.args = BroadcastArgs{0};
  const auto units = plan(ready, 1 << 20);
  CHECK_MSG(shape(units) == (std::vector<size_t>{1, 1, 1, 1, 1}), "%s", str(shape(units)).c_str());
  if (units.size() == 5) {
    CHECK(units[1].error == "mismatched allreduce 'bad'" && units[1].pieces[0].entry == ready[1].entry);
    CHECK(units[3].type == OpType::kBroadcast);
    CHECK(units[0].error.empty() && units[2].error.empty());
  }
  // An error for an op this rank never submitted produces no unit.
  std::vector<ReadyOp> foreign = {op("x", 4)};
  foreign[0].entry = nullptr;
  foreign[0].response.error = "ranks [1] did not submit it";
  CHECK(plan(foreign, 1 << 20).empty());
}

TEST(grouped_op_counts_its_pieces) {
  ReadyOp g = op("group", 4);
  g.entry->request.tensors = {{DataType::kFloat32, {4}}, {DataType::kFloat32, {6}}, {DataType::kFloat32, {2}}};
  const auto units = plan({g}, 1 << 20);
  CHECK(units.size() == 1 && units[0].pieces.size() == 3 && units[0].bytes == 48);
  CHECK(g.entry->pieces_left == 3);
  for (size_t t = 0; t < 3 && units.size() == 1; ++t) CHECK(units[0].pieces[t].tensor == t);
  // Split by the threshold, the pieces still belong to one op.
  const auto split = plan({g}, 40);
  CHECK_MSG(shape(split) == (std::vector<size_t>{2, 1}), "%s", str(shape(split)).c_str());
  CHECK(g.entry->pieces_left == 3);
}

HVD_TEST_MAIN()
