// Ring all-gather with a different block size per rank (allgatherv): p-1
// steps, each rank forwarding the block it received in the previous step.
// Output is the concatenation of every rank's block in rank order.
#pragma once

#include <cstddef>
#include <vector>

#include "transport/context.h"

namespace hvdtorch {

void ringAllgatherv(Context& ctx, const void* input, void* output, const std::vector<size_t>& bytes_per_rank);

// A range of bytes of a buffer.
struct ByteRange {
  size_t offset = 0;
  size_t bytes = 0;
};

// The same schedule among `members` only (global ranks, ring order; this
// rank at `pos`), in place in `out`: member i's part is parts[i], pieces of
// `out` it holds; on return every member holds every part. Step s forwards
// the part received at step s-1, piece by piece (every part has as many
// pieces, in the same order on every rank; empty ones are skipped on both
// ends), so each link carries one message at a time in each direction.
void ringAllgatherAmong(Context& ctx, const std::vector<int>& members, int pos, char* out,
                        const std::vector<std::vector<ByteRange>>& parts);

// Broadcast over links along a chain (root -> root+1 -> ...), segmented so the
// chain pipelines. Used where the backend has no broadcast of its own.
void chainBroadcast(Context& ctx, void* data, size_t bytes, int root, size_t segment_bytes = 1 << 20);

}  // namespace hvdtorch
