// Ring all-gather with a different block size per rank (allgatherv): p-1
// steps, each rank forwarding the block it received in the previous step.
// Output is the concatenation of every rank's block in rank order.
#pragma once

#include <cstddef>
#include <vector>

#include "transport/context.h"

namespace hvdtorch {

void ringAllgatherv(Context& ctx, const void* input, void* output, const std::vector<size_t>& bytes_per_rank);

// Broadcast over links along a chain (root -> root+1 -> ...), segmented so the
// chain pipelines. Used where the backend has no broadcast of its own.
void chainBroadcast(Context& ctx, void* data, size_t bytes, int root, size_t segment_bytes = 1 << 20);

}  // namespace hvdtorch
