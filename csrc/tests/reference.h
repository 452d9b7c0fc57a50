// Test inputs whose reductions are exact in every tested dtype, and their
// reference result, shared by the algorithm tests.
#pragma once

#include <algorithm>
#include <cstddef>

#include "common/dtype.h"

namespace hvdtorch::test {

// Rank r's value at index i: small integers in [-5, 5], so sums over up to
// 5 ranks and products over up to 4 are exact even in bfloat16.
inline double valueOf(int r, size_t i) { return static_cast<double>((r * 7 + i * 3) % 11) - 5.0; }

// What reducing valueOf(0..p-1, i) with `op` must give.
inline double reference(ReduceOp op, int p, size_t i) {
  double acc = valueOf(0, i);
  for (int r = 1; r < p; ++r) {
    const double v = valueOf(r, i);
    acc = op == ReduceOp::kSum   ? acc + v
          : op == ReduceOp::kMin ? std::min(acc, v)
          : op == ReduceOp::kMax ? std::max(acc, v)
                                 : acc * v;
  }
  return acc;
}

}  // namespace hvdtorch::test
