// Two-level all-gather with a different block size per rank (allgatherv)
// for jobs on several hosts: every byte crosses each host's link once
// (the floor: a host receives the blocks of the ranks of every other host,
// and sends its own ranks' blocks to each), where the flat ring of
// ring_allgather.h sends every block through every edge of the ring, so a
// host's link carries (p-1) blocks each way instead of (hosts-1) x
// local_size (1.5x the floor at 2 hosts x 2 ranks, nearly 2x with many
// ranks per host).
//
//  1. Across hosts: each rank all-gathers its own block with the ranks of
//     the same local rank on the other hosts (topo.cross_ranks, a ring of
//     num_hosts): it then holds its "column", the blocks of every rank with
//     its local rank. Those peers are on other hosts: Context::link takes
//     the remote transport.
//  2. On the host: the local ranks all-gather their columns (a ring of
//     local_size over the host's links, shared memory where the Context
//     has it): local rank j forwards column j, one block per host.
// Output: every rank's block at its rank's place, as ringAllgatherv; the
// ranks of a host need not be numbered together.
//
// Applies to a homogeneous topology (the same number of ranks on every
// host) of more than one host and more than one rank per host; otherwise
// the flat ring is as good (one rank per host, one host) or the columns do
// not line up. Every rank decides alike: the topology is the same everywhere.
#pragma once

#include <cstddef>
#include <vector>

#include "transport/context.h"

namespace hvdtorch {

bool hierarchicalAllgatherApplies(const Topology& topo);

// As ringAllgatherv (bytes_per_rank: one block size per rank, input this
// rank's block); InvalidArgument where hierarchicalAllgatherApplies is false.
void hierarchicalAllgatherv(Context& ctx, const void* input, void* output, const std::vector<size_t>& bytes_per_rank);

}  // namespace hvdtorch
