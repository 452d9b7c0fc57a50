#include "gradients/wire_codec.h"

#include "common/error.h"

namespace hvdtorch {

WireCodec wireCodecFromName(const std::string& name) {
  if (name == "none") return WireCodec::kNone;
  if (name == "fp16") return WireCodec::kFp16;
  throw InvalidArgument(strCat("hvdtorch: unknown gradient codec '", name, "' (known: none, fp16)"));
}

const char* wireCodecName(WireCodec codec) {
  switch (codec) {
    case WireCodec::kNone: return "none";
    case WireCodec::kFp16: return "fp16";
  }
  return "?";
}

DataType wireDtype(WireCodec codec, DataType dtype) {
  switch (codec) {
    case WireCodec::kNone: return dtype;
    case WireCodec::kFp16: return isFloating(dtype) && dtypeSize(dtype) > 2 ? DataType::kFloat16 : dtype;
  }
  return dtype;
}

}  // namespace hvdtorch
