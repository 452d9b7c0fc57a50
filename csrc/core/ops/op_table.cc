// The op table (engine/op_spec.h says what each column means): the one
// place that lists the collectives. Rows in OpType order.
#include "engine/op_spec.h"
#include "ops/allgather.h"
#include "ops/allreduce.h"
#include "ops/alltoall.h"
#include "ops/barrier.h"
#include "ops/broadcast.h"
#include "ops/join.h"
#include "ops/reducescatter.h"

namespace hvdtorch {

const std::vector<OpSpec>& opTable() {
  using namespace ops;
  // clang-format off
  static const std::vector<OpSpec> table = {
    // type                  name             args payload                 plan payload                     first_dim_free cacheable fuses inline_run         while_joined               outputs               staging              make_plan          execute
    {OpType::kAllreduce,     "allreduce",     argsIndex<ReduceArgs>(),    planIndex<NoPlan>(),            false,         true,     true,  InlineRun::kIfSmall, WhileJoined::kAddsZeros,  Outputs::kLikeInputs, Staging::kByOp,      nullptr,           executeAllreduce},
    {OpType::kAllgather,     "allgather",     argsIndex<NoArgs>(),        planIndex<AllgatherPlan>(),     true,          false,    false, InlineRun::kNever,   WhileJoined::kAddsNoRows, Outputs::kAllocated,  Staging::kByOp,      planAllgather,     executeAllgather},
    {OpType::kBroadcast,     "broadcast",     argsIndex<BroadcastArgs>(), planIndex<NoPlan>(),            false,         true,     false, InlineRun::kNever,   WhileJoined::kReceives,   Outputs::kLikeInputs, Staging::kByOp,      nullptr,           executeBroadcast},
    {OpType::kBarrier,       "barrier",       argsIndex<NoArgs>(),        planIndex<NoPlan>(),            false,         true,     false, InlineRun::kAlways,  WhileJoined::kTakesPart,  Outputs::kNone,       Staging::kByExecutor, nullptr,           executeBarrier},
    {OpType::kAlltoall,      "alltoall",      argsIndex<AlltoallArgs>(),  planIndex<AlltoallPlan>(),      true,          false,    false, InlineRun::kNever,   WhileJoined::kRefused,    Outputs::kAllocated,  Staging::kByOp,      planAlltoall,      executeAlltoall},
    {OpType::kReducescatter, "reducescatter", argsIndex<ReduceArgs>(),    planIndex<ReducescatterPlan>(), false,         true,     false, InlineRun::kNever,   WhileJoined::kRefused,    Outputs::kAllocated,  Staging::kByOp,      planReducescatter, executeReducescatter},
    {OpType::kJoin,          "join",          argsIndex<NoArgs>(),        planIndex<JoinPlan>(),          false,         false,    false, InlineRun::kAlways,  WhileJoined::kIsJoin,     Outputs::kAllocated,  Staging::kByExecutor, nullptr,           executeJoin},
  };
  // clang-format on
  return table;
}

const OpSpec* findOpSpec(uint8_t value) {
  const auto& table = opTable();
  return value < table.size() ? &table[value] : nullptr;
}

const OpSpec& opSpec(OpType type) {
  const OpSpec* spec = findOpSpec(static_cast<uint8_t>(type));
  if (!spec) throw InvalidArgument(strCat("op type ", unsigned(static_cast<uint8_t>(type)), " is not in the op table"));
  return *spec;
}

const char* opTypeName(OpType type) {
  const OpSpec* spec = findOpSpec(static_cast<uint8_t>(type));
  return spec ? spec->name : "unknown";
}

}  // namespace hvdtorch
