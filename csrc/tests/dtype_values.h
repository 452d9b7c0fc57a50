// Reads and writes element i of a buffer of any floating-point or int32
// dtype as a double: the tests' way to fill inputs and check results for
// every dtype with one loop. Other dtypes throw (the test does not cover them).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/error.h"
#include "device/reduce_kernels.h"

namespace hvdtorch::test {

inline void put(DataType t, void* buf, size_t i, double v) {
  switch (t) {
    case DataType::kFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); return;
    case DataType::kFloat64: static_cast<double*>(buf)[i] = v; return;
    case DataType::kInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); return;
    case DataType::kBFloat16: static_cast<uint16_t*>(buf)[i] = floatToBf16(static_cast<float>(v)); return;
    case DataType::kFloat16: static_cast<uint16_t*>(buf)[i] = floatToHalf(static_cast<float>(v)); return;
    default: throw InvalidArgument("test: dtype not covered");
  }
}

inline double get(DataType t, const void* buf, size_t i) {
  switch (t) {
    case DataType::kFloat32: return static_cast<const float*>(buf)[i];
    case DataType::kFloat64: return static_cast<const double*>(buf)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(buf)[i];
    case DataType::kBFloat16: return bf16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kFloat16: return halfToFloat(static_cast<const uint16_t*>(buf)[i]);
    default: throw InvalidArgument("test: dtype not covered");
  }
}

}  // namespace hvdtorch::test
