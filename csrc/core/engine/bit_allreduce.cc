#include "engine/bit_allreduce.h"

#include <algorithm>

namespace hvdtorch {

namespace {

// One rank's view of a group of global ranks taking part in a step.
struct Group {
  const std::vector<int>& ranks;  // global ranks, the group's order
  int me;                         // my index in `ranks`
  int size() const { return static_cast<int>(ranks.size()); }
};

class Steps {
 public:
  Steps(Context& ctx, Deadline d, BitAllreduceCost* cost, size_t bytes)
      : ctx_(ctx), d_(d), cost_(cost), bytes_(bytes) {}

  void send(int peer, const std::vector<uint64_t>& w) {
    ctx_.link(peer).send(w.data(), bytes_, d_);
    count(true);
  }
  void recvAnd(int peer, std::vector<uint64_t>& w) {
    ctx_.link(peer).recv(scratch(w.size()), bytes_, d_);
    count(false);
    for (size_t i = 0; i < w.size(); ++i) w[i] &= scratch_[i];
  }
  void recvInto(int peer, std::vector<uint64_t>& w) {
    ctx_.link(peer).recv(w.data(), bytes_, d_);
    count(false);
  }
  // Both directions at once with `peer`: the receive is posted before the
  // send, so transports that complete a send only once the peer posted its
  // receive cannot deadlock.
  void exchangeAnd(int peer, std::vector<uint64_t>& w) {
    Link& link = ctx_.link(peer);
    auto r = link.irecv(scratch(w.size()), bytes_);
    auto s = link.isend(w.data(), bytes_);
    r->wait(d_);
    s->wait(d_);
    count(true);
    count(false);
    for (size_t i = 0; i < w.size(); ++i) w[i] &= scratch_[i];
  }

 private:
  uint64_t* scratch(size_t n) {
    scratch_.resize(n);
    return scratch_.data();
  }
  void count(bool sent) {
    if (!cost_) return;
    if (sent) {
      ++cost_->sent;
      cost_->bytes_sent += bytes_;
    } else {
      ++cost_->received;
      cost_->bytes_received += bytes_;
    }
  }
  Context& ctx_;
  Deadline d_;
  BitAllreduceCost* cost_;
  size_t bytes_;
  std::vector<uint64_t> scratch_;
};

// Recursive doubling over the group, with the fold for a non-power-of-two size.
void recursiveDoubling(Steps& io, const Group& g, std::vector<uint64_t>& w) {
  const int p = g.size();
  if (p <= 1) return;
  int pow2 = 1;
  while (pow2 * 2 <= p) pow2 *= 2;
  const int me = g.me;
  if (me >= pow2) {  // folded: hand over, get the result back at the end
    io.send(g.ranks[me - pow2], w);
    io.recvInto(g.ranks[me - pow2], w);
    return;
  }
  if (me + pow2 < p) io.recvAnd(g.ranks[me + pow2], w);
  for (int mask = 1; mask < pow2; mask <<= 1) io.exchangeAnd(g.ranks[me ^ mask], w);
  if (me + pow2 < p) io.send(g.ranks[me + pow2], w);
}

// Binomial tree towards index 0: each rank receives from its children, then
// sends to its parent.
void treeReduce(Steps& io, const Group& g, std::vector<uint64_t>& w) {
  for (int mask = 1; mask < g.size(); mask <<= 1) {
    if (g.me & mask) {
      io.send(g.ranks[g.me - mask], w);
      return;
    }
    if (g.me + mask < g.size()) io.recvAnd(g.ranks[g.me + mask], w);
  }
}

// The same tree the other way: index 0's vector reaches everyone.
void treeBroadcast(Steps& io, const Group& g, std::vector<uint64_t>& w) {
  int mask = 1;
  while (mask < g.size() && !(g.me & mask)) mask <<= 1;
  if (g.me != 0) io.recvInto(g.ranks[g.me - mask], w);
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (g.me + mask < g.size()) io.send(g.ranks[g.me + mask], w);
}

int indexOf(const std::vector<int>& ranks, int rank) {
  return static_cast<int>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
}

}  // namespace

void bitAndAllreduce(Context& ctx, std::vector<uint64_t>& words, Deadline deadline, BitAllreduceShape shape,
                     BitAllreduceCost* cost) {
  const Topology& t = ctx.topo();
  if (t.size <= 1 || words.empty()) return;
  Steps io(ctx, deadline, cost, words.size() * sizeof(uint64_t));
  if (shape == BitAllreduceShape::kFlat || t.num_hosts == t.size) {
    std::vector<int> all(t.size);
    for (int r = 0; r < t.size; ++r) all[r] = r;
    recursiveDoubling(io, Group{all, t.rank}, words);
    return;
  }
  const Group local{t.local_ranks, t.local_rank};
  treeReduce(io, local, words);
  if (t.local_rank == 0) {
    // One leader per host: the first rank of every host, in host order.
    std::vector<int> leaders(t.num_hosts, -1);
    for (int r = 0; r < t.size; ++r)
      if (leaders[t.host_of_rank[r]] < 0) leaders[t.host_of_rank[r]] = r;
    recursiveDoubling(io, Group{leaders, indexOf(leaders, t.rank)}, words);
  }
  treeBroadcast(io, local, words);
}

}  // namespace hvdtorch
