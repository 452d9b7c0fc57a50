#include "algorithms/native_allreduce.h"

namespace hvdtorch {

void NativeAllreduce::allreduce(Context& ctx, void* data, size_t count, DataType dtype, ReduceOp op) {
  if (ctx.size() <= 1 || count == 0) return;
  NativeCollectives* native = ctx.native();
  if (native != nullptr && native->supports(dtype, op)) {
    native->allreduce(data, count, dtype, op);
  } else {
    fallback_.allreduce(ctx, data, count, dtype, op);
  }
}

bool NativeAllreduce::autoCandidate(const Context& ctx, DataType dtype, ReduceOp op) const {
  return supports(ctx, dtype, op) && ctx.native() != nullptr && ctx.native()->supports(dtype, op);
}

}  // namespace hvdtorch
