// What every op's entry function shares: where an op is (for the
// "rank r: <op> '<name>'" prefix of its errors, built only when one is
// raised), tensor specs, the process-set check, and the policy of the
// reducing ops (all-reduce, reduce-scatter), applied here and nowhere else:
//  * the reduce op must be one of Horovod's values;
//  * bool tensors take neither Average nor scale factors.
// Average itself travels as such; the executor runs it as a Sum divided by
// the number of ranks on the way out (exactly, for integers).
#pragma once

#include <string>
#include <vector>

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

}  // namespace hvdtorch::ops
