// Which contiguous range of a flat gradient bucket each rank owns: the one
// rule of the sharded optimizer's layout (hvdtorch/zero/layout.py, through
// _C.shard_range) and of the reducer's shard strategies
// (csrc/torch/strategies/), so that the range a rank steps is the
// range its reduction hands back.
//
// Set rank r of n owns numel / n elements, one more for the first numel % n
// ranks, in rank order: exactly the rows a reduce-scatter of the flat bucket
// gives rank r (ops/reducescatter.h, reducescatterRows), and what an
// all-gather of the shards puts back together. A range may be empty (a
// bucket smaller than n).
#pragma once

#include <cstdint>

namespace hvdtorch {

struct ShardRange {
  int64_t start = 0;
  int64_t end = 0;  // one past the last element
};

// InvalidArgument unless 0 <= rank < size and numel >= 0.
ShardRange shardRange(int64_t numel, int rank, int size);

}  // namespace hvdtorch
