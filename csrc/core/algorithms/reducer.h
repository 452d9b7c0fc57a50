// The reducer interface: an in-place all-reduce over every rank of a Context.
//
// Contract:
//  * Every rank calls allreduce() with the same count, dtype and op, in the
//    same order relative to other collectives on the same Context.
//  * `data` holds this rank's contribution on entry and the reduction of all
//    ranks' contributions on return, bit-identical on every rank.
//  * op is Sum, Min, Max or Product; Average is Sum plus a postscale applied
//    by the caller (fused with the copy out of the fusion buffer).
//  * Any count is valid, 0 and count < size included.
//  * Failures (peer died, deadline) throw CollectiveError; the buffer is then
//    undefined.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "common/dtype.h"
#include "transport/context.h"

namespace hvdtorch {

class Reducer {
 public:
  virtual ~Reducer() = default;
  virtual const char* name() const = 0;
  virtual void allreduce(Context& ctx, void* data, size_t count, DataType dtype, ReduceOp op) = 0;
};

enum class ReducerKind { kAuto, kRing, kNode, kCentral, kNative };

// "auto", "ring", "node", "central", "native"; throws InvalidArgument otherwise.
ReducerKind parseReducerKind(const std::string& name);
const char* reducerKindName(ReducerKind kind);

// Splits `count` elements into `parts` contiguous ranges as evenly as
// possible (the first count % parts ranges get one extra element).
struct Range {
  size_t offset;
  size_t count;
};
Range evenSplit(size_t count, size_t parts, size_t index);

}  // namespace hvdtorch
