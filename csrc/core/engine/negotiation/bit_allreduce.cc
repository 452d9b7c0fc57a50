#include "engine/negotiation/bit_allreduce.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "engine/negotiation/control_frame.h"

namespace hvdtorch {

namespace {

// One rank's view of a group of global ranks taking part in a step.
struct Group {
  const std::vector<int>& ranks;  // global ranks, the group's order
  int me;                         // my index in `ranks`
  int size() const { return static_cast<int>(ranks.size()); }
};

// Every message is one control frame (control_frame.h): a peer that stopped
// on an error may send its last word instead of its vector, and the frame
// says which it is (messageOf() throws PeerStopped for a last word).
class Steps {
 public:
  Steps(Context& ctx, Deadline d, BitAllreduceCost* cost, size_t bytes)
      : ctx_(ctx), d_(d), cost_(cost), bytes_(bytes) {}

  void send(int peer, const std::vector<uint64_t>& w) {
    sendFrame(ctx_.link(peer), FrameKind::kMessage, w.data(), bytes_, d_);
    count(true);
  }
  void recvAnd(int peer, std::vector<uint64_t>& w) { andInto(w, receive(peer, recvFrame(ctx_.link(peer), d_))); }
  void recvInto(int peer, std::vector<uint64_t>& w) {
    const std::vector<char> in = receive(peer, recvFrame(ctx_.link(peer), d_));
    std::memcpy(w.data(), in.data(), bytes_);
  }
  // Both directions at once with `peer`.
  void exchangeAnd(int peer, std::vector<uint64_t>& w) {
    Frame f = exchangeFrames(ctx_.link(peer), w.data(), bytes_, d_);
    count(true);
    andInto(w, receive(peer, std::move(f)));
  }

 private:
  std::vector<char> receive(int peer, Frame f) {
    std::vector<char> in = messageOf(std::move(f), peer);
    if (in.size() != bytes_)
      throw CollectiveError(strCat("rank ", ctx_.rank(), ": rank ", peer, " sent a bit vector of ", in.size(),
                                   " bytes, expected ", bytes_, " (do all ranks use the same configuration?)"));
    count(false);
    return in;
  }
  void andInto(std::vector<uint64_t>& w, const std::vector<char>& in) const {
    for (size_t i = 0; i < w.size(); ++i) {
      uint64_t v = 0;
      std::memcpy(&v, in.data() + i * sizeof v, sizeof v);
      w[i] &= v;
    }
  }
  void count(bool sent) {
    if (!cost_) return;
    // What travels is the frame, plus the tail of a long vector.
    const size_t wire = kFrameBytes + (bytes_ > kFrameInline ? bytes_ - kFrameInline : 0);
    if (sent) {
      ++cost_->sent;
      cost_->bytes_sent += wire;
    } else {
      ++cost_->received;
      cost_->bytes_received += wire;
    }
  }
  Context& ctx_;
  Deadline d_;
  BitAllreduceCost* cost_;
  size_t bytes_;
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
  // The host's result comes down from its leader, which waited on the other
  // hosts until the same deadline: wait a little longer, so that its last
  // word (the link to another host that failed) arrives before this rank
  // could only blame the leader.
  Steps down(ctx, deadline.extendedBy(ctx.relayGrace()), cost, words.size() * sizeof(uint64_t));
  treeBroadcast(t.local_rank == 0 ? io : down, local, words);
}

}  // namespace hvdtorch
