#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "device/reduce_kernels.h"

using namespace hvdtorch;

TEST(half_roundtrip_exact_values) {
  const float values[] = {0.f,
                          -0.f,
                          1.f,
                          -2.5f,
                          65504.f,
                          6.103515625e-05f /*min normal*/,
                          5.960464477539063e-08f /*min subnormal*/,
                          1024.f,
                          0.333251953125f};
  for (float v : values) CHECK_MSG(halfToFloat(floatToHalf(v)) == v, "value %g", v);
  CHECK(std::isinf(halfToFloat(floatToHalf(1e6f))));
  CHECK(std::isnan(halfToFloat(floatToHalf(std::nanf("")))));
  // Round to nearest even: 2049 lies between 2048 and 2050 in binary16.
  CHECK(halfToFloat(floatToHalf(2049.f)) == 2048.f);
  CHECK(halfToFloat(floatToHalf(2051.f)) == 2052.f);
  // Every binary16 bit pattern survives a round trip through float (NaNs aside).
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = halfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    CHECK_MSG(floatToHalf(f) == h, "pattern %04x", h);
  }
}

TEST(bf16_roundtrip) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    CHECK_MSG(floatToBf16(f) == b, "pattern %04x", b);
  }
  CHECK(bf16ToFloat(floatToBf16(1.00390625f)) == 1.0f);  // ties to even
}

template <typename T>
void checkTyped(DataType dt) {
  const size_t n = 1037;  // not a multiple of any vector width
  std::vector<T> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<T>(i % 7 + 1);
    b[i] = static_cast<T>(i % 5 + 1);
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    std::vector<T> d = a;
    reduceInto(d.data(), b.data(), n, dt, op);
    for (size_t i = 0; i < n; ++i) {
      T want = op == ReduceOp::kSum   ? static_cast<T>(a[i] + b[i])
               : op == ReduceOp::kMin ? std::min(a[i], b[i])
               : op == ReduceOp::kMax ? std::max(a[i], b[i])
                                      : static_cast<T>(a[i] * b[i]);
      CHECK_MSG(d[i] == want, "%s %s at %zu", dtypeName(dt), reduceOpName(op), i);
    }
  }
  std::vector<T> s = a;
  scaleBuffer(s.data(), n, dt, 0.5);
  for (size_t i = 0; i < n; ++i) CHECK(s[i] == static_cast<T>(static_cast<double>(a[i]) * 0.5));
}

TEST(typed_reductions) {
  checkTyped<uint8_t>(DataType::kUInt8);
  checkTyped<int8_t>(DataType::kInt8);
  checkTyped<int16_t>(DataType::kInt16);
  checkTyped<int32_t>(DataType::kInt32);
  checkTyped<int64_t>(DataType::kInt64);
  checkTyped<float>(DataType::kFloat32);
  checkTyped<double>(DataType::kFloat64);
}

TEST(half_reductions_match_float_rounded_once) {
  const size_t n = 777;
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    auto to = dt == DataType::kFloat16 ? floatToHalf : floatToBf16;
    auto from = dt == DataType::kFloat16 ? halfToFloat : bf16ToFloat;
    std::vector<uint16_t> a(n), b(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = to(0.1f * static_cast<float>(i));
      b[i] = to(-0.03f * static_cast<float>(i) + 1.0f);
    }
    std::vector<uint16_t> d = a;
    reduceInto(d.data(), b.data(), n, dt, ReduceOp::kSum);
    for (size_t i = 0; i < n; ++i) CHECK(d[i] == to(from(a[i]) + from(b[i])));
    d = a;
    reduceInto(d.data(), b.data(), n, dt, ReduceOp::kMax);
    for (size_t i = 0; i < n; ++i) CHECK(from(d[i]) == std::max(from(a[i]), from(b[i])));
  }
}

TEST(bool_reductions_are_logical) {
  uint8_t a[4] = {0, 0, 1, 1}, b[4] = {0, 1, 0, 1};
  uint8_t d[4];
  std::memcpy(d, a, 4);
  reduceInto(d, b, 4, DataType::kBool, ReduceOp::kMax);
  CHECK(d[0] == 0 && d[1] == 1 && d[2] == 1 && d[3] == 1);
  std::memcpy(d, a, 4);
  reduceInto(d, b, 4, DataType::kBool, ReduceOp::kMin);
  CHECK(d[0] == 0 && d[1] == 0 && d[2] == 0 && d[3] == 1);
}

TEST(integer_average_divides_exactly) {
  // Expected values are written out by hand (exact integer division toward
  // zero), not computed the way the kernel computes them.
  {
    // 49 ranks each holding 1: sum 49, average exactly 1 (49 * (1/49.0) is
    // 0.99999... in double and would truncate to 0).
    int32_t v[1] = {49};
    copyAveraged(v, v, 1, DataType::kInt32, 49, 1.0);
    CHECK_MSG(v[0] == 1, "got %d", v[0]);
  }
  {
    // Two ranks holding 2^53 + 1: the sum 2^54 + 2 halves to 2^53 + 1 exactly.
    const int64_t big = (int64_t(1) << 53) + 1;
    int64_t v[1] = {2 * big};
    copyAveraged(v, v, 1, DataType::kInt64, 2, 1.0);
    CHECK_MSG(v[0] == 9007199254740993LL, "got %lld", static_cast<long long>(v[0]));
  }
  {
    // Sign-mixed sums truncate toward zero (floor would give -4 and -3).
    int16_t src[6] = {-7, 7, -6, 5, 0, -1};
    int16_t dst[6];
    copyAveraged(dst, src, 6, DataType::kInt16, 2, 1.0);
    const int16_t want[6] = {-3, 3, -3, 2, 0, 0};
    for (int i = 0; i < 6; ++i) CHECK_MSG(dst[i] == want[i], "i=%d got %d want %d", i, dst[i], want[i]);
  }
  {
    uint8_t v[2] = {255, 7};
    copyAveraged(v, v, 2, DataType::kUInt8, 2, 1.0);
    CHECK(v[0] == 127 && v[1] == 3);
  }
  {
    // The postscale comes after the exact division: (7 / 2) * 3 = 9, where
    // 7 * (3 / 2.0) would give 10.
    int32_t v[1] = {7};
    copyAveraged(v, v, 1, DataType::kInt32, 2, 3.0);
    CHECK_MSG(v[0] == 9, "got %d", v[0]);
  }
  {
    // Floating types fold the divisor into the factor: 3 / 4 * 2 = 1.5.
    float v[1] = {3.f};
    copyAveraged(v, v, 1, DataType::kFloat32, 4, 2.0);
    CHECK(v[0] == 1.5f);
  }
  {
    int32_t v[1] = {5};
    CHECK_THROWS(copyAveraged(v, v, 1, DataType::kInt32, 0, 1.0), InvalidArgument);
  }
}

HVD_TEST_MAIN()
