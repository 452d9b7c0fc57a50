#include "gradients/shard_range.h"

#include <algorithm>

#include "common/error.h"

namespace hvdtorch {

ShardRange shardRange(int64_t numel, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size || numel < 0)
    throw InvalidArgument(strCat("hvdtorch: no shard ", rank, " of ", size, " of ", numel, " elements"));
  const int64_t base = numel / size;
  const int64_t extra = numel % size;
  ShardRange r;
  r.start = rank * base + std::min<int64_t>(rank, extra);
  r.end = r.start + base + (rank < extra ? 1 : 0);
  return r;
}

}  // namespace hvdtorch
