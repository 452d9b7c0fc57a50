// Where each parameter of a flat gradient bucket lives: the one packing rule
// of the gradient reducer's buckets (csrc/torch/grad_reducer.cpp) and of the
// sharded optimizer's flat parameters (hvdtorch/zero/layout.py and its
// checkpoints, through _C.packed_offsets), so that a bucket's slots and the
// parameter views over its flat buffer are the same elements.
//
// Parameters are packed in the bucket's order, each right after the one
// before it, with no padding: offsets[i] = numels[0] + ... + numels[i-1].
#pragma once

#include <cstdint>
#include <vector>

namespace hvdtorch {

struct BucketPacking {
  std::vector<int64_t> offsets;  // element offset of each parameter
  int64_t numel = 0;             // the flat bucket's elements
};

// InvalidArgument for a negative count.
BucketPacking packBucket(const std::vector<int64_t>& numels);

}  // namespace hvdtorch
