// The steady state of negotiation without a coordinator (Romero et al.,
// NSDI'22; Horovod's response-cache path): every rank holds a vector of
// 64-bit words (one bit per cached op it has ready, plus status bits), and
// every rank obtains the bitwise AND over all ranks. An op whose bit survives
// is ready everywhere and runs in cache order, identically on every rank,
// with no round trip to rank 0.
//
// Two shapes, both O(log p) messages per rank:
//  * flat: recursive doubling over every rank. With p' the largest power of
//    two <= p, ranks p' .. p-1 first fold their vector into rank r - p',
//    the first p' ranks exchange with partner r ^ 2^k for k = 0 .. log2 p'-1,
//    and the folded ranks get the result back. A rank handles at most
//    2 log2 p' + 2 messages (sent plus received).
//  * hierarchical: the ranks of one host reduce to the host's first rank
//    over a binomial tree (over the same-host links, i.e. shared memory),
//    only those leaders run the flat algorithm across hosts, and each
//    leader hands the result back down the tree. Cross-host traffic is one
//    rank per host; a leader handles 2 log2(local size) + 2 log2 hosts + 2
//    messages at most.
//
// Contract:
//  * Every rank of `ctx` calls it with vectors of the same length, at the
//    same point of the traffic on `ctx`'s links (control messages on one
//    link are matched in posting order).
//  * On return `words` holds the AND over all ranks, identical everywhere.
//  * Every message is one control frame (control_frame.h). Every wait is
//    bounded by `deadline`; a dead peer or the deadline throws
//    CollectiveError / TimeoutError naming the peer, and a peer's last word
//    in place of its vector throws PeerStopped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/deadline.h"
#include "transport/context.h"

namespace hvdtorch {

// What one call cost this rank (for the scale benchmark and tests).
struct BitAllreduceCost {
  int sent = 0;
  int received = 0;
  size_t bytes_sent = 0;
  size_t bytes_received = 0;
  int messages() const { return sent + received; }
};

enum class BitAllreduceShape { kFlat, kHierarchical };

void bitAndAllreduce(Context& ctx, std::vector<uint64_t>& words, Deadline deadline, BitAllreduceShape shape,
                     BitAllreduceCost* cost = nullptr);

}  // namespace hvdtorch
