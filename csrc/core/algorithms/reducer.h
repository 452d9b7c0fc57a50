// The reducer interface: an in-place all-reduce over every rank of a Context,
// and optionally a reduce-scatter. Reducers are listed in one table
// (reducer_registry.h), which is the only place that names them.
//
// Contract:
//  * Every rank calls allreduce() with the same count, dtype and op, in the
//    same order relative to other collectives on the same Context.
//  * `data` holds this rank's contribution on entry and the reduction of all
//    ranks' contributions on return, bit-identical on every rank.
//  * op is Sum, Min, Max or Product, and kAdasum for the reducers whose
//    supports() says so (the adasum reducer); Average is Sum plus a
//    postscale applied by the caller (fused with the copy out of the fusion
//    buffer).
//  * Any count is valid, 0 and count < size included.
//  * Failures (peer died, deadline) throw CollectiveError; the buffer is then
//    undefined.
//  * supports() is a pure function of the context, dtype and op, so every
//    rank answers it alike (the auto choice relies on it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/link_cost.h"
#include "common/dtype.h"
#include "transport/context.h"

namespace hvdtorch {

class Reducer {
 public:
  virtual ~Reducer() = default;
  virtual const char* name() const = 0;
  virtual void allreduce(Context& ctx, void* data, size_t count, DataType dtype, ReduceOp op) = 0;
  // The all-reduce of `in` into `out` (count elements each; `in` is left as
  // it is, and in == out is allreduce()). Default: copies `in` into `out`,
  // then allreduce(out). A reducer that copies its input anyway (node: into
  // its shared slots) reads `in` and writes `out` there instead, which
  // saves a pass over the data for an op with a fresh output.
  virtual void allreduceInto(Context& ctx, const void* in, void* out, size_t count, DataType dtype, ReduceOp op);
  // Whether allreduce() serves this dtype/op here (default: the element-wise
  // ops Sum, Min, Max, Product on every dtype).
  virtual bool supports(const Context& ctx, DataType dtype, ReduceOp op) const;
  // Whether `auto` may pick it for this dtype/op (default: when supported).
  virtual bool autoCandidate(const Context& ctx, DataType dtype, ReduceOp op) const { return supports(ctx, dtype, op); }
  // What one all-reduce puts on the busiest host's link on this context's
  // topology (link_cost.h), for the cost model's priors. Default: nothing,
  // which is right on one host; a reducer that runs across hosts says.
  virtual LinkTraffic linkTraffic(const Context& /*ctx*/) const { return {}; }
  // The tunable values this instance runs with, by name (segment sizes,
  // windows, shards), read from the instance itself: what the knobs that
  // configure it became (Engine::settingsInUse). Default: none.
  virtual std::map<std::string, int64_t> settings() const { return {}; }

  // Reduce-scatter, for reducers that have one on this context (default:
  // none). `data` holds this rank's contribution: ctx.size() consecutive
  // blocks, block r of `counts[r]` elements. On return block ctx.rank() holds
  // the reduction of every rank's block ctx.rank(); the other blocks are
  // undefined. Every rank passes the same counts.
  virtual bool hasReduceScatter(const Context& ctx) const { return false; }
  virtual void reduceScatter(Context& ctx, void* data, const std::vector<size_t>& counts, DataType dtype, ReduceOp op);
};

// Index of a reducer in the registry (reducer_registry.h); kAutoReducer lets
// the cost model pick one per message. It travels in requests: every rank
// runs the same binary, so the indices agree.
using ReducerId = uint8_t;
constexpr ReducerId kAutoReducer = 0xff;

// Offsets of consecutive blocks: offsets[r] = counts[0] + ... + counts[r-1].
std::vector<size_t> blockOffsets(const std::vector<size_t>& counts);

// Splits `count` elements into `parts` contiguous ranges as evenly as
// possible (the first count % parts ranges get one extra element).
struct Range {
  size_t offset;
  size_t count;
};
Range evenSplit(size_t count, size_t parts, size_t index);

}  // namespace hvdtorch
