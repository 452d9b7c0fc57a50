#include "algorithms/hierarchical_allgather.h"

#include <cstring>

#include "common/error.h"

namespace hvdtorch {

namespace {

struct Piece {
  size_t offset = 0;
  size_t bytes = 0;
};

// Ring all-gather among `members` (ring order; this rank at `pos`): member
// i's part is parts[i], pieces of `out` it holds; on return every member
// holds every part. Step s forwards the part received at step s-1, piece by
// piece (every part has as many pieces, in the same order on every rank,
// and empty ones are skipped on both ends), so each link carries one
// message at a time in each direction.
void ringAmong(Context& ctx, const std::vector<int>& members, int pos, char* out,
               const std::vector<std::vector<Piece>>& parts) {
  const int m = static_cast<int>(members.size());
  if (m == 1) return;
  Link& right = ctx.link(members[(pos + 1) % m]);
  Link& left = ctx.link(members[(pos - 1 + m) % m]);
  const Deadline deadline = ctx.deadline();
  for (int step = 0; step < m - 1; ++step) {
    const auto& send = parts[((pos - step) % m + m) % m];
    const auto& recv = parts[((pos - step - 1) % m + m) % m];
    for (size_t k = 0; k < send.size(); ++k) {
      std::unique_ptr<LinkRequest> s, r;
      if (recv[k].bytes > 0) r = left.irecv(out + recv[k].offset, recv[k].bytes);
      if (send[k].bytes > 0) s = right.isend(out + send[k].offset, send[k].bytes);
      if (r) r->wait(deadline);
      if (s) s->wait(deadline);
    }
  }
}

}  // namespace

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
  std::vector<Piece> block(p);
  size_t at = 0;
  for (int r = 0; r < p; ++r) {
    block[r] = {at, bytes_per_rank[r]};
    at += bytes_per_rank[r];
  }
  char* out = static_cast<char*>(output);
  if (block[me].bytes > 0) std::memmove(out + block[me].offset, input, block[me].bytes);

  // 1. Across hosts: my column (the ranks of my local rank, one per host).
  std::vector<std::vector<Piece>> own(topo.cross_ranks.size());
  for (size_t i = 0; i < own.size(); ++i) own[i] = {block[topo.cross_ranks[i]]};
  ringAmong(ctx, topo.cross_ranks, topo.cross_rank, out, own);

  // 2. On the host: local rank j's part is column j, in rank order.
  std::vector<std::vector<Piece>> columns(topo.local_size);
  for (int r = 0; r < p; ++r) columns[topo.local_rank_of[r]].push_back(block[r]);
  ringAmong(ctx, topo.local_ranks, topo.local_rank, out, columns);
}

}  // namespace hvdtorch
