// The op table: ops' rows (engine/op_spec.h says what each column means),
// the one place that lists the collectives. Whoever makes an Engine hands
// this table to it (Engine's constructor), so the engine reads each op's
// row, plan and execute functions without including or linking ops/.
#pragma once

#include <vector>

#include "engine/op_spec.h"

namespace hvdtorch::ops {

// Every op, in OpType order; the same vector on every call.
const std::vector<OpSpec>& opTable();

}  // namespace hvdtorch::ops
