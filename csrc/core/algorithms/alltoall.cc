#include "algorithms/alltoall.h"

#include <cstring>

#include "algorithms/reducer.h"
#include "common/error.h"

namespace hvdtorch {

void alltoall(Context& ctx, const AlltoallOptions& opts) {
  const int p = ctx.size();
  const int me = ctx.rank();
  if (static_cast<int>(opts.send_bytes.size()) != p || static_cast<int>(opts.recv_bytes.size()) != p)
    throw InvalidArgument(strCat("rank ", me, ": alltoall needs one send and one receive size per rank"));
  if (opts.send_bytes[me] != opts.recv_bytes[me])
    throw InvalidArgument(
        strCat("rank ", me, ": alltoall keeps ", opts.send_bytes[me], " bytes but expects ", opts.recv_bytes[me]));
  const std::vector<size_t> send_at = blockOffsets(opts.send_bytes);
  const std::vector<size_t> recv_at = blockOffsets(opts.recv_bytes);
  const char* in = static_cast<const char*>(opts.input);
  char* out = static_cast<char*>(opts.output);

  std::vector<std::unique_ptr<LinkRequest>> recvs, sends;
  for (int k = 1; k < p; ++k) {
    const int src = (me - k + p) % p;
    if (opts.recv_bytes[src] > 0) recvs.push_back(ctx.link(src).irecv(out + recv_at[src], opts.recv_bytes[src]));
  }
  for (int k = 1; k < p; ++k) {
    const int dst = (me + k) % p;
    if (opts.send_bytes[dst] > 0) sends.push_back(ctx.link(dst).isend(in + send_at[dst], opts.send_bytes[dst]));
  }
  if (opts.send_bytes[me] > 0) std::memcpy(out + recv_at[me], in + send_at[me], opts.send_bytes[me]);
  const Deadline deadline = ctx.deadline();
  for (auto& r : recvs) r->wait(deadline);
  for (auto& s : sends) s->wait(deadline);
}

}  // namespace hvdtorch
