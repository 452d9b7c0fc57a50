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

// Reduction operators with Horovod's names. Average is Sum followed by a
// postscale of 1/size; it never reaches a reduce kernel.
enum class ReduceOp : uint8_t {
  kAverage = 0,
  kSum = 1,
  kAdasum = 2,  // reserved for Horovod enum compatibility; rejected
  kMin = 3,
  kMax = 4,
  kProduct = 5,
};

const char* reduceOpName(ReduceOp op);

}  // namespace hvdtorch
