#include "algorithms/ring_allgather.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace hvdtorch {

void ringAllgatherv(Context& ctx, const void* input, void* output, const std::vector<size_t>& bytes_per_rank) {
  const int p = ctx.size();
  const int me = ctx.rank();
  if (static_cast<int>(bytes_per_rank.size()) != p)
    throw InvalidArgument(strCat("rank ", me, ": allgatherv needs one block size per rank"));
  std::vector<size_t> offset(p + 1, 0);
  for (int r = 0; r < p; ++r) offset[r + 1] = offset[r] + bytes_per_rank[r];
  char* out = static_cast<char*>(output);
  if (bytes_per_rank[me] > 0) std::memmove(out + offset[me], input, bytes_per_rank[me]);
  if (p == 1) return;

  Link& right = ctx.link((me + 1) % p);
  Link& left = ctx.link((me - 1 + p) % p);
  const Deadline deadline = ctx.deadline();
  for (int step = 0; step < p - 1; ++step) {
    const int send_block = ((me - step) % p + p) % p;
    const int recv_block = ((me - step - 1) % p + p) % p;
    std::unique_ptr<LinkRequest> s, r;
    if (bytes_per_rank[recv_block] > 0) r = left.irecv(out + offset[recv_block], bytes_per_rank[recv_block]);
    if (bytes_per_rank[send_block] > 0) s = right.isend(out + offset[send_block], bytes_per_rank[send_block]);
    if (r) r->wait(deadline);
    if (s) s->wait(deadline);
  }
}

void chainBroadcast(Context& ctx, void* data, size_t bytes, int root, size_t segment_bytes) {
  const int p = ctx.size();
  if (p == 1 || bytes == 0) return;
  const int me = ctx.rank();
  const int pos = ((me - root) % p + p) % p;  // position along the chain
  const Deadline deadline = ctx.deadline();
  char* base = static_cast<char*>(data);
  Link* prev = pos > 0 ? &ctx.link((me - 1 + p) % p) : nullptr;
  Link* next = pos < p - 1 ? &ctx.link((me + 1) % p) : nullptr;
  std::vector<std::unique_ptr<LinkRequest>> sends;
  for (size_t off = 0; off < bytes; off += segment_bytes) {
    const size_t n = std::min(segment_bytes, bytes - off);
    if (prev) prev->recv(base + off, n, deadline);
    if (next) sends.push_back(next->isend(base + off, n));
  }
  for (auto& s : sends) s->wait(deadline);
}

}  // namespace hvdtorch
