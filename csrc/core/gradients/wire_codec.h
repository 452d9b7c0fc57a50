// How a gradient travels: the codec seam of the gradient core. A codec names
// the dtype a tensor of a given dtype goes on the wire in (encode: the bucket
// or the compressed tensor is that dtype); the reduced result is converted
// back into the tensor's own dtype (decode). Every path that compresses asks
// here: the C++ GradientReducer's buckets (every gradient path's, the sharded optimizer's too) and
// hvdtorch.Compression (collectives/compression.py, through _C.wire_dtype).
//
// fp16: the 32- and 64-bit floats go as float16; 16-bit floats (float16,
// bfloat16) go as they are -- a bfloat16 sent as float16 would save no byte
// and lose its range --, as do integers and bool.
// bf16 (a mixed-precision policy's reduce_dtype=bfloat16): the 32- and
// 64-bit floats go as bfloat16; 16-bit floats, integers and bool as they are.
//
// A new codec is one enumerator, its name and its row in wireDtype(); a codec
// that changes more than the dtype (low-rank, sparsification) adds its encode
// and decode steps beside these.
#pragma once

#include <cstdint>
#include <string>

#include "common/dtype.h"

namespace hvdtorch {

enum class WireCodec : uint8_t {
  kNone = 0,
  kFp16 = 1,
  kBf16 = 2,
};

// "none", "fp16" or "bf16"; InvalidArgument for anything else.
WireCodec wireCodecFromName(const std::string& name);
const char* wireCodecName(WireCodec codec);

// The dtype a tensor of `dtype` travels in under `codec`.
DataType wireDtype(WireCodec codec, DataType dtype);

}  // namespace hvdtorch
