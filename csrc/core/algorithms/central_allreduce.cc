#include "algorithms/central_allreduce.h"

#include <algorithm>
#include <vector>

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

LinkTraffic CentralAllreduce::linkTraffic(const Context& ctx) const {
  const Topology& t = ctx.topo();
  const int p = t.size;
  LinkTraffic out;
  if (p <= 1 || t.num_hosts <= 1) return out;
  const int shards = std::clamp(opts_.shards, 1, p);
  std::vector<int> on_host(static_cast<size_t>(t.num_hosts), 0);
  for (int r = 0; r < p; ++r) ++on_host[t.host_of_rank[r]];
  // Per host, bytes leaving it per byte of the buffer: a server sends its part back to every rank off its
  // host; a rank sends its part to every server off its host.
  std::vector<double> leaving(static_cast<size_t>(t.num_hosts), 0.0);
  for (int part = 0; part < shards; ++part) {
    const int server_host = t.host_of_rank[static_cast<int>(static_cast<long long>(part) * p / shards)];
    for (int h = 0; h < t.num_hosts; ++h)
      leaving[h] += (h == server_host ? p - on_host[h] : on_host[h]) / static_cast<double>(shards);
  }
  // To the server and back, one segment after the other (a rank waits for each reply before the next).
  out.messages = 2;
  out.messages_per_byte = 2.0 / static_cast<double>(std::max<size_t>(1, opts_.segment_bytes));
  out.bytes_per_byte = *std::max_element(leaving.begin(), leaving.end());
  return out;
}

}  // namespace hvdtorch
