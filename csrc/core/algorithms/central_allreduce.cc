#include "algorithms/central_allreduce.h"

#include <algorithm>

#include "device/reduce_kernels.h"

namespace hvdtorch {

void CentralAllreduce::allreduce(Context& ctx, void* data, size_t count, DataType dtype, ReduceOp op) {
  const int p = ctx.size();
  if (p <= 1 || count == 0) return;
  const int me = ctx.rank();
  const int shards = std::clamp(opts_.shards, 1, p);
  const size_t esize = dtypeSize(dtype);
  const size_t seg_elems = std::max<size_t>(1, opts_.segment_bytes / esize);
  char* base = static_cast<char*>(data);
  const Deadline deadline = ctx.deadline();

  for (int part = 0; part < shards; ++part) {
    const int server = static_cast<int>(static_cast<long long>(part) * p / shards);
    const Range range = evenSplit(count, shards, part);
    for (size_t done = 0; done < range.count; done += seg_elems) {
      const size_t n = std::min(seg_elems, range.count - done);
      char* seg = base + (range.offset + done) * esize;
      const size_t bytes = n * esize;
      if (me == server) {
        if (scratch_.size() < bytes * (p - 1)) scratch_.resize(bytes * (p - 1));
        std::vector<std::unique_ptr<LinkRequest>> in;
        for (int peer = 0, slot = 0; peer < p; ++peer) {
          if (peer == me) continue;
          in.push_back(ctx.link(peer).irecv(scratch_.data() + bytes * slot++, bytes));
        }
        for (size_t i = 0; i < in.size(); ++i) {  // reduce each arrival as it lands
          in[i]->wait(deadline);
          reduceInto(seg, scratch_.data() + bytes * i, n, dtype, op);
        }
        std::vector<std::unique_ptr<LinkRequest>> out;
        for (int peer = 0; peer < p; ++peer)
          if (peer != me) out.push_back(ctx.link(peer).isend(seg, bytes));
        for (auto& r : out) r->wait(deadline);
      } else {
        Link& link = ctx.link(server);
        auto sent = link.isend(seg, bytes);
        sent->wait(deadline);  // the result overwrites seg: the send must be done first
        link.recv(seg, bytes, deadline);
      }
    }
  }
}

}  // namespace hvdtorch
