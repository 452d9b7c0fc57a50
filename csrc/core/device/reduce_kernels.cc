#include "device/reduce_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"

namespace hvdtorch {

// ---- half-precision conversions -------------------------------------------

float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {  // inf / nan
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {  // normal
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {  // zero
    bits = sign;
  } else {  // subnormal: renormalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | ((112u - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or nan
    return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u);
  }
  if (absx >= 0x477ff000u) return sign | 0x7c00u;  // overflows to inf
  if (absx < 0x38800000u) {                        // result is subnormal or zero
    if (absx < 0x33000000u) return sign;           // rounds to zero
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  // normal: rebias exponent, round mantissa to nearest even
  uint32_t r = absx - 0x38000000u;
  r += 0x0fffu + ((r >> 13) & 1u);
  return sign | static_cast<uint16_t>(r >> 13);
}

float bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// ---- element-wise reduce ---------------------------------------------------

namespace {

struct SumOp {
  template <typename T> static T apply(T a, T b) { return a + b; }
};
struct MinOp {
  template <typename T> static T apply(T a, T b) { return b < a ? b : a; }
};
struct MaxOp {
  template <typename T> static T apply(T a, T b) { return a < b ? b : a; }
};
struct ProdOp {
  template <typename T> static T apply(T a, T b) { return a * b; }
};

template <typename T, typename Op>
void reduceLoop(T* __restrict dst, const T* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(Op::apply(dst[i], src[i]));
}

// float16 / bfloat16: widen, combine, narrow. Processed in blocks so the
// widening loops vectorise independently of the narrowing.
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float), typename Op>
void reduceHalfLoop(uint16_t* __restrict dst, const uint16_t* __restrict src, size_t n) {
  constexpr size_t kBlock = 256;
  float a[kBlock], b[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    for (size_t i = 0; i < m; ++i) a[i] = ToF(dst[base + i]);
    for (size_t i = 0; i < m; ++i) b[i] = ToF(src[base + i]);
    for (size_t i = 0; i < m; ++i) a[i] = Op::apply(a[i], b[i]);
    for (size_t i = 0; i < m; ++i) dst[base + i] = FromF(a[i]);
  }
}

void reduceBool(uint8_t* __restrict dst, const uint8_t* __restrict src, size_t n, ReduceOp op) {
  // Sum/Max are logical OR, Min/Product logical AND (torch.distributed's rule).
  if (op == ReduceOp::kSum || op == ReduceOp::kMax) {
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>((dst[i] | src[i]) != 0);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>((dst[i] != 0) & (src[i] != 0));
  }
}

template <typename Op>
void dispatchType(void* dst, const void* src, size_t n, DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
      return reduceLoop<uint8_t, Op>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
    case DataType::kInt8: return reduceLoop<int8_t, Op>(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), n);
    case DataType::kInt16:
      return reduceLoop<int16_t, Op>(static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), n);
    case DataType::kInt32:
      return reduceLoop<int32_t, Op>(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n);
    case DataType::kInt64:
      return reduceLoop<int64_t, Op>(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n);
    case DataType::kFloat32: return reduceLoop<float, Op>(static_cast<float*>(dst), static_cast<const float*>(src), n);
    case DataType::kFloat64:
      return reduceLoop<double, Op>(static_cast<double*>(dst), static_cast<const double*>(src), n);
    case DataType::kFloat16:
      return reduceHalfLoop<halfToFloat, floatToHalf, Op>(static_cast<uint16_t*>(dst),
                                                          static_cast<const uint16_t*>(src), n);
    case DataType::kBFloat16:
      return reduceHalfLoop<bf16ToFloat, floatToBf16, Op>(static_cast<uint16_t*>(dst),
                                                          static_cast<const uint16_t*>(src), n);
    case DataType::kBool: break;  // handled by the caller
  }
}

template <typename T>
void scaleLoop(T* __restrict buf, size_t n, double factor) {
  if constexpr (std::is_floating_point_v<T>) {
    const T f = static_cast<T>(factor);
    for (size_t i = 0; i < n; ++i) buf[i] *= f;
  } else {
    for (size_t i = 0; i < n; ++i) buf[i] = static_cast<T>(static_cast<double>(buf[i]) * factor);
  }
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void scaleHalfLoop(uint16_t* __restrict buf, size_t n, double factor) {
  const float f = static_cast<float>(factor);
  for (size_t i = 0; i < n; ++i) buf[i] = FromF(ToF(buf[i]) * f);
}

}  // namespace

void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0) return;
  if (dtype == DataType::kBool) {
    reduceBool(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), count, op);
    return;
  }
  switch (op) {
    case ReduceOp::kSum: return dispatchType<SumOp>(dst, src, count, dtype);
    case ReduceOp::kMin: return dispatchType<MinOp>(dst, src, count, dtype);
    case ReduceOp::kMax: return dispatchType<MaxOp>(dst, src, count, dtype);
    case ReduceOp::kProduct: return dispatchType<ProdOp>(dst, src, count, dtype);
    case ReduceOp::kAverage:
    case ReduceOp::kAdasum: break;
  }
  throw InvalidArgument(strCat("reduceInto: op ", reduceOpName(op), " is not an element-wise reduction"));
}

void scaleBuffer(void* buf, size_t count, DataType dtype, double factor) {
  if (count == 0 || factor == 1.0) return;
  switch (dtype) {
    case DataType::kUInt8: return scaleLoop(static_cast<uint8_t*>(buf), count, factor);
    case DataType::kInt8: return scaleLoop(static_cast<int8_t*>(buf), count, factor);
    case DataType::kInt16: return scaleLoop(static_cast<int16_t*>(buf), count, factor);
    case DataType::kInt32: return scaleLoop(static_cast<int32_t*>(buf), count, factor);
    case DataType::kInt64: return scaleLoop(static_cast<int64_t*>(buf), count, factor);
    case DataType::kFloat32: return scaleLoop(static_cast<float*>(buf), count, factor);
    case DataType::kFloat64: return scaleLoop(static_cast<double*>(buf), count, factor);
    case DataType::kFloat16: return scaleHalfLoop<halfToFloat, floatToHalf>(static_cast<uint16_t*>(buf), count, factor);
    case DataType::kBFloat16:
      return scaleHalfLoop<bf16ToFloat, floatToBf16>(static_cast<uint16_t*>(buf), count, factor);
    case DataType::kBool: throw InvalidArgument("scaling is not defined for bool tensors");
  }
}

}  // namespace hvdtorch

namespace hvdtorch {

namespace {
template <typename T>
void copyScaledLoop(T* __restrict dst, const T* __restrict src, size_t n, double factor) {
  if constexpr (std::is_floating_point_v<T>) {
    const T f = static_cast<T>(factor);
    for (size_t i = 0; i < n; ++i) dst[i] = src[i] * f;
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(static_cast<double>(src[i]) * factor);
  }
}
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void copyScaledHalf(uint16_t* __restrict dst, const uint16_t* __restrict src, size_t n, double factor) {
  const float f = static_cast<float>(factor);
  for (size_t i = 0; i < n; ++i) dst[i] = FromF(ToF(src[i]) * f);
}
template <typename T>
void divideLoop(T* __restrict dst, const T* __restrict src, size_t n, int64_t divisor) {
  // Integer division in C++ truncates toward zero; widen so int8/uint8 do not
  // promote through int in surprising ways and int64 stays exact.
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(static_cast<int64_t>(src[i]) / divisor);
}
}  // namespace

void copyAveraged(void* dst, const void* src, size_t count, DataType dtype, int64_t divisor, double factor) {
  if (divisor <= 0) throw InvalidArgument(strCat("copyAveraged: divisor ", divisor, " is not positive"));
  if (divisor == 1 || isFloating(dtype)) {
    copyScaled(dst, src, count, dtype, factor / static_cast<double>(divisor));
    return;
  }
  if (count == 0) return;
  switch (dtype) {
    case DataType::kUInt8:
      divideLoop(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), count, divisor);
      break;
    case DataType::kInt8: divideLoop(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), count, divisor); break;
    case DataType::kInt16:
      divideLoop(static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), count, divisor);
      break;
    case DataType::kInt32:
      divideLoop(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), count, divisor);
      break;
    case DataType::kInt64:
      divideLoop(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), count, divisor);
      break;
    default: throw InvalidArgument(strCat("Average is not defined for ", dtypeName(dtype), " tensors"));
  }
  scaleBuffer(dst, count, dtype, factor);
}

void copyScaled(void* dst, const void* src, size_t count, DataType dtype, double factor) {
  if (count == 0) return;
  if (factor == 1.0) {
    if (dst != src) std::memmove(dst, src, count * dtypeSize(dtype));
    return;
  }
  switch (dtype) {
    case DataType::kUInt8:
      return copyScaledLoop(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), count, factor);
    case DataType::kInt8:
      return copyScaledLoop(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), count, factor);
    case DataType::kInt16:
      return copyScaledLoop(static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), count, factor);
    case DataType::kInt32:
      return copyScaledLoop(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), count, factor);
    case DataType::kInt64:
      return copyScaledLoop(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), count, factor);
    case DataType::kFloat32:
      return copyScaledLoop(static_cast<float*>(dst), static_cast<const float*>(src), count, factor);
    case DataType::kFloat64:
      return copyScaledLoop(static_cast<double*>(dst), static_cast<const double*>(src), count, factor);
    case DataType::kFloat16:
      return copyScaledHalf<halfToFloat, floatToHalf>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src),
                                                      count, factor);
    case DataType::kBFloat16:
      return copyScaledHalf<bf16ToFloat, floatToBf16>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src),
                                                      count, factor);
    case DataType::kBool: throw InvalidArgument("scaling is not defined for bool tensors");
  }
}

}  // namespace hvdtorch
