#include "ops/op_table.h"

namespace hvdtorch::ops {

const std::vector<OpSpec>& opTable() {
#define HVDTORCH_ROW(Op, op) op##Row(),
  static const std::vector<OpSpec> table = {HVDTORCH_OPS(HVDTORCH_ROW)};
#undef HVDTORCH_ROW
  return table;
}

}  // namespace hvdtorch::ops
