#include "torch_tensor.h"

#include "common/error.h"

namespace hvdtorch {

DataType toDataType(at::ScalarType t, const std::string& where) {
  switch (t) {
    case at::kByte: return DataType::kUInt8;
    case at::kChar: return DataType::kInt8;
    case at::kShort: return DataType::kInt16;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kBool: return DataType::kBool;
    default: break;
  }
  throw InvalidArgument(strCat("hvdtorch: ", where, ": dtype ", c10::toString(t),
                               " is not supported (hvdtorch reduces uint8, int8, int16, int32, int64, float16, "
                               "bfloat16, float32, float64 and bool; a complex tensor goes as torch.view_as_real(t))"));
}

at::ScalarType toScalarType(DataType t) {
  switch (t) {
    case DataType::kUInt8: return at::kByte;
    case DataType::kInt8: return at::kChar;
    case DataType::kInt16: return at::kShort;
    case DataType::kInt32: return at::kInt;
    case DataType::kInt64: return at::kLong;
    case DataType::kFloat16: return at::kHalf;
    case DataType::kBFloat16: return at::kBFloat16;
    case DataType::kFloat32: return at::kFloat;
    case DataType::kFloat64: return at::kDouble;
    case DataType::kBool: return at::kBool;
  }
  return at::kByte;
}

at::ScalarType wireScalarType(WireCodec codec, at::ScalarType dtype) {
  if (codec == WireCodec::kNone) return dtype;
  DataType t{};
  try {
    t = toDataType(dtype, "wire dtype");
  } catch (const InvalidArgument&) {
    return dtype;  // a dtype hvdtorch does not carry (complex, say): as it is
  }
  return toScalarType(wireDtype(codec, t));
}

}  // namespace hvdtorch
