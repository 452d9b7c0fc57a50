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
  std::vector<int> members(p);
  std::vector<std::vector<ByteRange>> parts(p);
  size_t at = 0;
  for (int r = 0; r < p; ++r) {
    members[r] = r;
    parts[r] = {ByteRange{at, bytes_per_rank[r]}};
    at += bytes_per_rank[r];
  }
  char* out = static_cast<char*>(output);
  if (bytes_per_rank[me] > 0) std::memmove(out + parts[me][0].offset, input, bytes_per_rank[me]);
  ringAllgatherAmong(ctx, members, me, out, parts);
}

void ringAllgatherAmong(Context& ctx, const std::vector<int>& members, int pos, char* out,
                        const std::vector<std::vector<ByteRange>>& parts) {
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
