// bool reductions follow torch.distributed's rule for every op: Sum and Max
// are a logical or, Min and Product a logical and, over the whole truth table.
#include <cstdint>
#include <cstring>

#include "check.h"
#include "device/reduce_kernels.h"

using namespace hvdtorch;

TEST(every_op_on_the_bool_truth_table) {
  const uint8_t a[4] = {0, 0, 1, 1}, b[4] = {0, 1, 0, 1};
  const uint8_t any[4] = {0, 1, 1, 1}, all[4] = {0, 0, 0, 1};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProduct}) {
    const bool is_or = op == ReduceOp::kSum || op == ReduceOp::kMax;
    uint8_t d[4];
    std::memcpy(d, a, 4);
    reduceInto(d, b, 4, DataType::kBool, op);
    for (int i = 0; i < 4; ++i)
      CHECK_MSG(d[i] == (is_or ? any[i] : all[i]), "%s: %d op %d gave %d", reduceOpName(op), a[i], b[i], d[i]);
  }
}

HVD_TEST_MAIN()
