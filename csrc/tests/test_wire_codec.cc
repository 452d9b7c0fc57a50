// The wire codecs' dtype rule (gradients/wire_codec.h), for every dtype.
#include <string>

#include "check.h"
#include "common/error.h"
#include "gradients/wire_codec.h"

using namespace hvdtorch;

TEST(fp16_halves_wide_floats_only) {
  CHECK(wireDtype(WireCodec::kFp16, DataType::kFloat32) == DataType::kFloat16);
  CHECK(wireDtype(WireCodec::kFp16, DataType::kFloat64) == DataType::kFloat16);
  CHECK(wireDtype(WireCodec::kFp16, DataType::kFloat16) == DataType::kFloat16);
  CHECK(wireDtype(WireCodec::kFp16, DataType::kBFloat16) == DataType::kBFloat16);
  for (DataType t :
       {DataType::kUInt8, DataType::kInt8, DataType::kInt16, DataType::kInt32, DataType::kInt64, DataType::kBool})
    CHECK(wireDtype(WireCodec::kFp16, t) == t);
}

TEST(bf16_halves_wide_floats_only) {
  CHECK(wireDtype(WireCodec::kBf16, DataType::kFloat32) == DataType::kBFloat16);
  CHECK(wireDtype(WireCodec::kBf16, DataType::kFloat64) == DataType::kBFloat16);
  CHECK(wireDtype(WireCodec::kBf16, DataType::kFloat16) == DataType::kFloat16);
  CHECK(wireDtype(WireCodec::kBf16, DataType::kBFloat16) == DataType::kBFloat16);
  for (DataType t :
       {DataType::kUInt8, DataType::kInt8, DataType::kInt16, DataType::kInt32, DataType::kInt64, DataType::kBool})
    CHECK(wireDtype(WireCodec::kBf16, t) == t);
}

TEST(none_keeps_every_dtype) {
  for (DataType t : {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16, DataType::kInt32})
    CHECK(wireDtype(WireCodec::kNone, t) == t);
}

TEST(names) {
  CHECK(wireCodecFromName("fp16") == WireCodec::kFp16);
  CHECK(wireCodecFromName("none") == WireCodec::kNone);
  CHECK(wireCodecFromName("bf16") == WireCodec::kBf16);
  CHECK(std::string(wireCodecName(WireCodec::kBf16)) == "bf16");
  CHECK(std::string(wireCodecName(WireCodec::kFp16)) == "fp16");
  CHECK_THROWS(wireCodecFromName("powersgd"), InvalidArgument);
}

HVD_TEST_MAIN()
