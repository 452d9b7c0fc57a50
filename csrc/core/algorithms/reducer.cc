#include "algorithms/reducer.h"

#include <cstring>

#include "common/error.h"

namespace hvdtorch {

bool Reducer::supports(const Context&, DataType, ReduceOp op) const {
  return op == ReduceOp::kSum || op == ReduceOp::kMin || op == ReduceOp::kMax || op == ReduceOp::kProduct;
}

void Reducer::allreduceInto(Context& ctx, const void* in, void* out, size_t count, DataType dtype, ReduceOp op) {
  if (in != out) std::memcpy(out, in, count * dtypeSize(dtype));
  allreduce(ctx, out, count, dtype, op);
}

void Reducer::reduceScatter(Context& ctx, void*, const std::vector<size_t>&, DataType, ReduceOp) {
  throw InvalidArgument(strCat("rank ", ctx.rank(), ": reducer ", name(), " has no reduce-scatter"));
}

std::vector<size_t> blockOffsets(const std::vector<size_t>& counts) {
  std::vector<size_t> offsets(counts.size(), 0);
  for (size_t r = 1; r < counts.size(); ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
  return offsets;
}

Range evenSplit(size_t count, size_t parts, size_t index) {
  const size_t base = count / parts;
  const size_t extra = count % parts;
  const size_t offset = index * base + (index < extra ? index : extra);
  return Range{offset, base + (index < extra ? 1 : 0)};
}

}  // namespace hvdtorch
