#include "ops/op_table.h"

#include "ops/allgather.h"
#include "ops/allreduce.h"
#include "ops/alltoall.h"
#include "ops/barrier.h"
#include "ops/broadcast.h"
#include "ops/join.h"
#include "ops/reducescatter.h"

namespace hvdtorch::ops {

const std::vector<OpSpec>& opTable() {
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

}  // namespace hvdtorch::ops
