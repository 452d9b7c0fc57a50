#include "gradients/wire_codec.h"

#include "common/error.h"

namespace hvdtorch {

WireCodec wireCodecFromName(const std::string& name) {
  if (name == "none") return WireCodec::kNone;
  if (name == "fp16") return WireCodec::kFp16;
  if (name == "bf16") return WireCodec::kBf16;
  throw InvalidArgument(strCat("hvdtorch: unknown gradient codec '", name, "' (known: none, fp16, bf16)"));
}

const char* wireCodecName(WireCodec codec) {
  switch (codec) {
    case WireCodec::kNone: return "none";
    case WireCodec::kFp16: return "fp16";
    case WireCodec::kBf16: return "bf16";
  }
  return "?";
}

DataType wireDtype(WireCodec codec, DataType dtype) {
  switch (codec) {
    case WireCodec::kNone: return dtype;
    case WireCodec::kFp16: return isFloating(dtype) && dtypeSize(dtype) > 2 ? DataType::kFloat16 : dtype;
    case WireCodec::kBf16: return isFloating(dtype) && dtypeSize(dtype) > 2 ? DataType::kBFloat16 : dtype;
  }
  return dtype;
}

}  // namespace hvdtorch
