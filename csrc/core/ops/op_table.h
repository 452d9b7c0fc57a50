// The op table: every op's row (engine/op_spec.h says what each column
// means), gathered in the order of HVDTORCH_OPS (engine/op_spec.h), the one
// list of the collectives. Each row lives beside its op, in ops/<op>.cc
// (<op>Row(), declared here for every listed op). Whoever makes an Engine
// hands this table to it (Engine's constructor), so the engine reads each
// op's row, plan and execute functions without including or linking ops/.
#pragma once

#include <vector>

#include "engine/op_spec.h"

namespace hvdtorch::ops {

// Each listed op's row, defined in its ops/<op>.cc.
#define HVDTORCH_DECLARE_ROW(Op, op) const OpSpec& op##Row();
HVDTORCH_OPS(HVDTORCH_DECLARE_ROW)
#undef HVDTORCH_DECLARE_ROW

// Every op, in OpType order; the same vector on every call.
const std::vector<OpSpec>& opTable();

}  // namespace hvdtorch::ops
