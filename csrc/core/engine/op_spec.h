// The table of ops: one row per collective says everything the engine needs
// to know about it, so that the engine's code (wire format, signatures,
// coordinator, cache, fusion, inline runs, joined ranks, executor) reads the
// row instead of switching on the op. The list of ops is HVDTORCH_OPS below,
// the one place that names them all; each op's row, entry function,
// planning and execution live in its own ops/<op>.{h,cc}, ops/op_table.h
// gathers the rows in list order, and that table is handed to the Engine's
// constructor, which makes it the table in use (useOpTable): the engine
// neither includes nor links ops/.
//
// Adding a collective: docs/architecture.md, "Recipes". The wire check
// (which op values a control message may carry) follows from the table.
//
// Contract: the table lists every OpType exactly once, in enum order, so
// that opTable()[v].type == v, each row with an execute function (useOpTable
// checks it). A tensor's device kind is part of the signature (TensorSpec);
// how device memory is staged for the reducers is the row's `staging`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/op_payloads.h"

namespace hvdtorch {

// Every collective, X(Op, op) each: `Op` names its OpType value (k<Op>) and
// its options struct (ops::<Op>Options, bound as _C.<Op>Options), `op` its
// entry function (ops::<op>) and its row (ops::<op>Row()). The order is the
// OpType order, which is the ops' value on the wire. Join: a rank out of
// data (hvd.join()); see Coordinator for what the others' ops do while it
// waits.
#define HVDTORCH_OPS(X)           \
  X(Allreduce, allreduce)         \
  X(Allgather, allgather)         \
  X(Broadcast, broadcast)         \
  X(Barrier, barrier)             \
  X(Alltoall, alltoall)           \
  X(Reducescatter, reducescatter) \
  X(Join, join)                   \
  X(Reduce, reduce)

#define HVDTORCH_OP_TYPE(Op, op) k##Op,
enum class OpType : uint8_t { HVDTORCH_OPS(HVDTORCH_OP_TYPE) };
#undef HVDTORCH_OP_TYPE
#define HVDTORCH_COUNT_OP(Op, op) +1  // NOLINT(bugprone-macro-parentheses): a term of the sum below
// How many ops HVDTORCH_OPS lists: the op table's length.
inline constexpr size_t kOpTypes = 0 HVDTORCH_OPS(HVDTORCH_COUNT_OP);
#undef HVDTORCH_COUNT_OP

// When a ready unit may run on the control thread instead of the executor
// (WorkQueue::push): saves a thread hand-off for work smaller than it.
enum class InlineRun : uint8_t {
  kNever,    // its size is not planned when it is queued
  kAlways,   // no payload
  kIfSmall,  // up to WorkQueue::kInlineUnitBytes
};

// What an op does while some ranks of its set have joined (hvd.join()). A
// joined rank runs a stand-in request on zeros and drops its outputs.
// Whatever the rule, an op whose payload names a root (rootRank(),
// engine/op_payloads.h) fails while that rank has joined.
enum class WhileJoined : uint8_t {
  kRefused,     // an error: the op cannot run without every rank's data
  kAddsZeros,   // joined ranks add zeros: where the payload says zeros are neutral (Sum, Average)
  kAddsNoRows,  // joined ranks contribute no rows (needs a first dimension)
  kReceives,    // joined ranks receive
  kTakesPart,   // no data; joined ranks simply take part
  kIsJoin,      // the join itself: ready once every rank has joined
};

// Where an op's outputs come from.
enum class Outputs : uint8_t {
  kNone,        // nothing (barrier)
  kLikeInputs,  // given by the caller, shaped as the inputs (may alias them)
  kAllocated,   // made through the entry's allocator once the plan fixes their shape
};

// How an op's device tensors (CUDA, simulated) reach the reducers, which
// work on host memory (engine/execution/host_staging.h).
enum class Staging : uint8_t {
  kByExecutor,  // the executor swaps the entry's buffers for pinned host copies around execute
  kByOp,        // execute stages them itself, or not at all where a device path takes them
};

struct Request;
struct WorkUnit;
class Executor;

// Every rank's request (by_rank[r], signatures already agreeing) -> the plan.
// Throws InvalidArgument when the requests cannot run (alltoall splits that
// do not fit), which the coordinator turns into an error response.
using MakePlan = OpPlan (*)(const std::vector<const Request*>& by_rank);
// Runs one negotiated unit of this op on the executor's context; completes
// or fails its entries. Transport errors propagate (Executor::run).
using Execute = void (*)(Executor& executor, WorkUnit& unit);

struct OpSpec {
  OpType type;
  const char* name;     // "allreduce": errors, describe(), timeline
  size_t args;          // index of its payload in OpArgs
  size_t plan;          // index of its plan in OpPlan
  bool first_dim_free;  // ranks may differ in dimension 0 (the rest must agree)
  // Its plan follows from the signature alone, so after the first time it
  // runs from the response cache (one bit per rank instead of the request).
  bool cacheable;
  // Consecutive ops of this type may share one unit, one piece per tensor
  // (engine/negotiation/fusion_plan.h, which compares their ReduceArgs: a
  // row that fuses carries ReduceArgs, and useOpTable checks it).
  bool fuses;
  InlineRun inline_run;
  WhileJoined while_joined;
  Outputs outputs;
  Staging staging;
  MakePlan make_plan;  // null: the plan is NoPlan (or, for join, the coordinator's)
  Execute execute;
};

// Row helpers: the index of a payload type in its variant.
template <typename Args>
constexpr size_t argsIndex() {
  return AlternativeIndex<Args, OpArgs>::value;
}
template <typename Plan>
constexpr size_t planIndex() {
  return AlternativeIndex<Plan, OpPlan>::value;
}

// Makes `table` the op table in use in this process, after checking the
// contract above (InvalidArgument). Requests are built, read and compared
// outside any one Engine (control frames, the response cache), so the table
// is the process's: every Engine's constructor calls this with the table it
// is handed, and code that handles requests without an Engine (tests,
// fuzzers, benchmarks) calls it first. The table must outlive its use (ops'
// is static); handing a different table later throws InvalidArgument.
void useOpTable(const std::vector<OpSpec>& table);
// The table in use; InvalidArgument when none is yet.
const std::vector<OpSpec>& opTable();
const OpSpec& opSpec(OpType type);
// The row of the op a control message names by `value`; null when no op has
// that value (a corrupt message).
const OpSpec* findOpSpec(uint8_t value);
// "unknown" for a value not in the table, or before any table is in use.
const char* opTypeName(OpType type);

}  // namespace hvdtorch
