// Element types the core understands. The torch layer maps at::ScalarType onto
// these; nothing below csrc/torch knows torch exists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hvdtorch {

enum class DataType : uint8_t {
  kUInt8 = 0,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kBool,
};

size_t dtypeSize(DataType t);
const char* dtypeName(DataType t);
bool isFloating(DataType t);

// Reduction operators with Horovod's names. Average is a Sum divided by the
// number of ranks on the way out (ops/allreduce.cc); it never reaches a
// reduce kernel. Adasum is not element-wise: only the adasum reducer
// (algorithms/adasum_allreduce.h) serves it.
enum class ReduceOp : uint8_t {
  kAverage = 0,
  kSum = 1,
  kAdasum = 2,
  kMin = 3,
  kMax = 4,
  kProduct = 5,
};

const char* reduceOpName(ReduceOp op);

}  // namespace hvdtorch
