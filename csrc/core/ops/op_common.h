// What every op's entry function shares: the entry builder (OpEntry: the
// request-building, checking and submission of every op), where an op is
// (for the "rank r: <op> '<name>'" prefix of its errors, built only when one
// is raised), tensor specs, the process-set check, and the policy of the
// reducing ops (all-reduce, reduce-scatter), applied here and nowhere else:
//  * the reduce op must be one of Horovod's values;
//  * bool tensors take neither Average nor scale factors.
// Average itself travels as such; the executor runs it as a Sum divided by
// the number of ranks on the way out (exactly, for integers).
#pragma once

#include <string>
#include <vector>

#include "common/error.h"
#include "engine/engine.h"

namespace hvdtorch::ops {

struct OpWhere {
  const Engine& engine;
  OpType type;
  const std::string& name;
  std::string str() const;  // "rank 2: allreduce 'grad.w'"
};

// Horovod's op values (Average 0 ... Product 5); InvalidArgument otherwise.
ReduceOp toReduceOp(int value);

// The process set an op goes to: it must exist and include this rank
// (InvalidArgument naming the set otherwise). Sizes and ranks in an op's
// arguments are the set's.
std::shared_ptr<const ProcessSet> checkProcessSet(const OpWhere& where, int32_t process_set_id);

TensorSpec specOf(const TensorBuffer& t);

// The one device every tensor of an op is on (the CPU for an op without
// tensors). InvalidArgument naming the op, the tensor and both devices when
// they differ, or when this process cannot use that device.
DeviceId checkOneDevice(const OpWhere& where, const std::vector<TensorPtr>& inputs,
                        const std::vector<TensorPtr>& outputs = {});

// The ReduceArgs of a reducing op over `tensors` (see above); the reducer
// and fusion fields are left at their defaults.
ReduceArgs reduceArgs(const OpWhere& where, ReduceOp op, double prescale, double postscale,
                      const std::vector<TensorPtr>& tensors);

// The entry builder: what every entry function (ops/<op>.cc) does but its
// own checks and payload. An entry function makes one, checks what its op
// needs (fail() raises the error), and submits:
//
//   int64_t broadcast(Engine& engine, BroadcastOptions opts) {
//     OpEntry op(engine, BroadcastOptions::kType, opts.name, opts.process_set_id);
//     const int32_t root = op.rootInSet(opts.root);
//     op.outputLikeInput(*opts.input, *opts.output);  // its checks, through fail()
//     return op.submit({std::move(opts.input)}, {std::move(opts.output)}, nullptr, BroadcastArgs{root});
//   }
//
// The checks run in this order, and nothing is sent when one throws
// (InvalidArgument naming the rank, op and name): the process set (the
// constructor), the op's own, then in submit() the output allocator (ops
// whose row says Outputs::kAllocated need one) and one device for all the
// op's tensors (checkOneDevice).
class OpEntry {
 public:
  // An op of process set `process_set_id`, checked (checkProcessSet).
  // `name` is the op's, which submit() moves into the request.
  OpEntry(Engine& engine, OpType type, std::string& name, int32_t process_set_id);
  // An op of the global set that takes no set (join): nothing to check.
  OpEntry(Engine& engine, OpType type, std::string& name);

  const OpWhere& where() const { return where_; }
  // The set the op goes to; only for ops made with a process set.
  const ProcessSet& processSet() const { return *set_; }

  // Raises InvalidArgument "<where>: <parts...>".
  template <typename... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    throw InvalidArgument(strCat(where_.str(), ": ", parts...));
  }
  // The check of the ops that take a list of row blocks (all-gather,
  // reduce-scatter): at least one tensor, each with a dimension 0.
  void needRows(const std::vector<TensorPtr>& inputs) const;
  // The root of an op with one (broadcast, reduce): `root_rank` is a global
  // rank (Horovod's rule, for sets too), which must be in the op's set;
  // returns its rank within the set, what the payload carries and the
  // executor needs. fail()s naming the set otherwise.
  int32_t rootInSet(int root_rank) const;
  // The check of the ops whose output mirrors their one input (broadcast,
  // reduce): the same number of elements and dtype; fail()s otherwise.
  void outputLikeInput(const TensorBuffer& input, const TensorBuffer& output) const;

  // Runs submit()'s checks (above), builds the entry -- the request (type,
  // set, name, one TensorSpec per input, `args`) and its tensors and
  // allocator -- and submits it to the engine; returns the handle.
  int64_t submit(std::vector<TensorPtr> inputs, std::vector<TensorPtr> outputs = {}, OutputAllocator allocate = nullptr,
                 OpArgs args = NoArgs{});

 private:
  Engine& engine_;
  std::string& name_;
  OpWhere where_;
  int32_t process_set_id_ = 0;
  std::shared_ptr<const ProcessSet> set_;
};

}  // namespace hvdtorch::ops
