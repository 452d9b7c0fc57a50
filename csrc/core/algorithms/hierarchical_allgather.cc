#include "algorithms/hierarchical_allgather.h"

#include <cstring>

#include "algorithms/ring_allgather.h"
#include "common/error.h"

namespace hvdtorch {

bool hierarchicalAllgatherApplies(const Topology& topo) {
  return topo.num_hosts > 1 && topo.local_size > 1 && topo.homogeneous();
}

void hierarchicalAllgatherv(Context& ctx, const void* input, void* output, const std::vector<size_t>& bytes_per_rank) {
  const Topology& topo = ctx.topo();
  const int p = ctx.size();
  const int me = ctx.rank();
  if (static_cast<int>(bytes_per_rank.size()) != p)
    throw InvalidArgument(strCat("rank ", me, ": allgatherv needs one block size per rank"));
  if (!hierarchicalAllgatherApplies(topo))
    throw InvalidArgument(strCat("rank ", me, ": the hierarchical all-gather needs several hosts with the same number",
                                 " (more than one) of ranks each"));
  std::vector<ByteRange> block(p);
  size_t at = 0;
  for (int r = 0; r < p; ++r) {
    block[r] = {at, bytes_per_rank[r]};
    at += bytes_per_rank[r];
  }
  char* out = static_cast<char*>(output);
  if (block[me].bytes > 0) std::memmove(out + block[me].offset, input, block[me].bytes);

  // 1. Across hosts: my column (the ranks of my local rank, one per host).
  std::vector<std::vector<ByteRange>> own(topo.cross_ranks.size());
  for (size_t i = 0; i < own.size(); ++i) own[i] = {block[topo.cross_ranks[i]]};
  ringAllgatherAmong(ctx, topo.cross_ranks, topo.cross_rank, out, own);

  // 2. On the host: local rank j's part is column j, in rank order.
  std::vector<std::vector<ByteRange>> columns(topo.local_size);
  for (int r = 0; r < p; ++r) columns[topo.local_rank_of[r]].push_back(block[r]);
  ringAllgatherAmong(ctx, topo.local_ranks, topo.local_rank, out, columns);
}

}  // namespace hvdtorch
