// The element-wise kernels of the CPU device (copy, scale, reduce-into,
// average), which every host-memory reducer also calls directly, and the
// reference arithmetic every other Device reproduces.
//
// float16/bfloat16 are widened to float for each operation and rounded back
// once, so a reduction over p ranks loses no more precision than p-1 additions
// in the dtype itself would. Loops are plain and __restrict-qualified so that
// the compiler vectorises them at -O3.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace hvdtorch {

// dst[i] = dst[i] (op) src[i] for i < count. op must not be Average.
void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);

// buf[i] *= factor. For integer dtypes the product is computed in double and
// truncated toward zero (Horovod's behaviour for scaled integer tensors).
void scaleBuffer(void* buf, size_t count, DataType dtype, double factor);

// Half-precision conversions (IEEE binary16 and bfloat16), round to nearest even.
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bf16ToFloat(uint16_t b);
uint16_t floatToBf16(float f);

}  // namespace hvdtorch

namespace hvdtorch {
// dst[i] = src[i] * factor (a plain copy when factor == 1). Used to fuse the
// prescale into the copy into the fusion buffer, so scaling costs no extra
// pass over memory. dst may equal src.
void copyScaled(void* dst, const void* src, size_t count, DataType dtype, double factor);

// dst[i] = (src[i] / divisor) * factor: the last step of every all-reduce,
// fused with the copy out of the fusion buffer. divisor is the number of
// ranks for Average and 1 otherwise; factor is the user's postscale.
// Floating types fold both into one factor. Integer types divide exactly,
// truncating toward zero, before the factor is applied (in double, truncated,
// as for any scaled integer tensor), so an integer Average never passes
// through floating point: 2^53+1 stays exact, and 49 summed over 49 ranks
// averages to 1, not to 0. dst may equal src.
void copyAveraged(void* dst, const void* src, size_t count, DataType dtype, int64_t divisor, double factor);
}  // namespace hvdtorch
