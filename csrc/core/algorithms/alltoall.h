// All-to-all with a different block size per pair of ranks (alltoallv), by
// pairwise exchange over the context's links: every rank sends block `dst`
// of its input to rank dst and receives rank src's block for it into block
// `src` of its output.
//
// Contract:
//  * Every rank calls it at the same point; send_bytes[dst] on rank src
//    equals recv_bytes[src] on rank dst (negotiation guarantees it).
//  * Input blocks are consecutive in rank order, as are output blocks.
//    Input and output must not overlap. Empty blocks send nothing.
//  * Every receive is posted before any send (a transport may complete a
//    send only once the peer has posted the matching receive), and sends go
//    out in pairwise order -- at step k to rank (me + k) mod p -- so no rank
//    is everyone's first destination.
//  * Failures throw CollectiveError; the output is then undefined.
#pragma once

#include <cstddef>
#include <vector>

#include "transport/context.h"

namespace hvdtorch {

struct AlltoallOptions {
  const void* input = nullptr;
  std::vector<size_t> send_bytes;  // per destination rank
  void* output = nullptr;
  std::vector<size_t> recv_bytes;  // per source rank
};

void alltoall(Context& ctx, const AlltoallOptions& opts);

}  // namespace hvdtorch
