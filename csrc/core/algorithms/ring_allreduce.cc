#include "algorithms/ring_allreduce.h"

#include <algorithm>
#include <deque>

#include "common/error.h"
#include "device/reduce_kernels.h"

namespace hvdtorch {

namespace {

// One message of the ring schedule: a segment of one block at one step.
struct Message {
  int step;       // 0 .. 2(p-1)-1; steps < p-1 are reduce-scatter
  size_t offset;  // element offset into the buffer
  size_t count;   // elements
};

int mod(int a, int p) { return ((a % p) + p) % p; }

// Appends `block`'s segments, as messages of step `step`.
void appendSegments(std::vector<Message>& msgs, int step, const Range& block, size_t seg_elems) {
  for (size_t done = 0; done < block.count; done += seg_elems)
    msgs.push_back({step, block.offset + done, std::min(seg_elems, block.count - done)});
}

// The messages ring position `pos` receives, in order, over `steps` steps.
// The block received at step s is (pos - s - 2) mod p; the left neighbour
// sends exactly this sequence, so both sides agree on every message size.
std::vector<Message> scheduleFor(int pos, int p, int steps, const std::vector<Range>& blocks, size_t seg_elems) {
  std::vector<Message> msgs;
  for (int step = 0; step < steps; ++step) appendSegments(msgs, step, blocks[mod(pos - step - 2, p)], seg_elems);
  return msgs;
}

std::vector<int> allRanks(const Context& ctx) {
  std::vector<int> all(ctx.size());
  for (int r = 0; r < ctx.size(); ++r) all[r] = r;
  return all;
}

}  // namespace

void RingAllreduce::allreduce(Context& ctx, void* data, size_t count, DataType dtype, ReduceOp op) {
  allreduceAmong(ctx, allRanks(ctx), data, count, dtype, op);
}

LinkTraffic RingAllreduce::linkTraffic(const Context& ctx) const { return ringTraffic(ctx.topo(), allRanks(ctx)); }

void RingAllreduce::reduceScatter(Context& ctx, void* data, const std::vector<size_t>& counts, DataType dtype,
                                  ReduceOp op) {
  if (static_cast<int>(counts.size()) != ctx.size())
    throw InvalidArgument(strCat("rank ", ctx.rank(), ": reduce-scatter needs one block size per rank"));
  const std::vector<size_t> offsets = blockOffsets(counts);
  std::vector<Range> blocks(counts.size());
  for (size_t r = 0; r < counts.size(); ++r) blocks[r] = Range{offsets[r], counts[r]};
  reduceScatterAmong(ctx, allRanks(ctx), data, blocks, dtype, op);
}

void RingAllreduce::allreduceAmong(Context& ctx, const std::vector<int>& members, void* data, size_t count,
                                   DataType dtype, ReduceOp op) {
  const size_t p = members.size();
  if (p <= 1 || count == 0) return;
  std::vector<Range> blocks(p);
  for (size_t i = 0; i < p; ++i) blocks[i] = evenSplit(count, p, i);
  run(ctx, members, data, blocks, dtype, op, true);
}

void RingAllreduce::reduceScatterAmong(Context& ctx, const std::vector<int>& members, void* data,
                                       const std::vector<Range>& blocks, DataType dtype, ReduceOp op) {
  if (blocks.size() != members.size())
    throw InvalidArgument(strCat("rank ", ctx.rank(), ": ring reduce-scatter needs one block per member"));
  if (members.size() <= 1) return;
  run(ctx, members, data, blocks, dtype, op, false);
}

void RingAllreduce::run(Context& ctx, const std::vector<int>& members, void* data, const std::vector<Range>& blocks,
                        DataType dtype, ReduceOp op, bool allgather) {
  const int p = static_cast<int>(members.size());
  const auto it = std::find(members.begin(), members.end(), ctx.rank());
  if (it == members.end()) throw InvalidArgument(strCat("rank ", ctx.rank(), ": ring called on a group it is not in"));
  const int pos = static_cast<int>(it - members.begin());
  const int rs_steps = p - 1;
  const int steps = allgather ? 2 * (p - 1) : p - 1;

  const size_t esize = dtypeSize(dtype);
  const size_t seg_elems = std::max<size_t>(1, opts_.segment_bytes / esize);
  const int window = std::max(1, opts_.window);
  char* base = static_cast<char*>(data);

  Link& right = ctx.link(members[(pos + 1) % p]);
  Link& left = ctx.link(members[(pos - 1 + p) % p]);
  const Deadline deadline = ctx.deadline();

  // What I receive follows my own schedule; what I send first is the block
  // my right neighbour receives at step 0. Later sends forward what arrives.
  const std::vector<Message> recvs = scheduleFor(pos, p, steps, blocks, seg_elems);
  std::vector<Message> sends_step0;
  appendSegments(sends_step0, 0, blocks[mod(pos - 1, p)], seg_elems);

  const size_t slot_bytes = seg_elems * esize;
  if (scratch_.size() < slot_bytes * window) scratch_.resize(slot_bytes * window);

  // Receives first: some transports (Gloo's unbound buffers) complete a send
  // only once the peer has posted the matching receive, so a rank must never
  // block on a send before its own receive window is posted. Sends are
  // therefore never waited for inside the loop, only at the end; they read
  // the caller's buffer in place, so keeping them outstanding costs nothing.
  //
  // Reduce-scatter messages land in a scratch slot and are reduced into
  // place; all-gather messages land in place directly. A region being
  // overwritten by a later all-gather receive was sent earlier by this rank,
  // and its new content cannot arrive before that send was read (it depends
  // on it), so no extra wait is needed.
  std::deque<std::unique_ptr<LinkRequest>> pending;
  size_t next_post = 0;
  auto postRecv = [&]() {
    const Message& m = recvs[next_post];
    void* dst = (m.step < rs_steps) ? static_cast<void*>(scratch_.data() + (next_post % window) * slot_bytes)
                                    : static_cast<void*>(base + m.offset * esize);
    pending.push_back(left.irecv(dst, m.count * esize));
    ++next_post;
  };
  while (next_post < recvs.size() && pending.size() < static_cast<size_t>(window)) postRecv();

  std::vector<std::unique_ptr<LinkRequest>> sends;
  auto postSend = [&](const Message& m) { sends.push_back(right.isend(base + m.offset * esize, m.count * esize)); };
  for (const Message& m : sends_step0) postSend(m);

  for (size_t i = 0; i < recvs.size(); ++i) {
    const Message& m = recvs[i];
    pending.front()->wait(deadline);
    pending.pop_front();
    if (m.step < rs_steps) {
      reduceInto(base + m.offset * esize, scratch_.data() + (i % window) * slot_bytes, m.count, dtype, op);
    }
    // The slot is free again: keep the window full.
    if (next_post < recvs.size()) postRecv();
    // Forward what was just completed: it is the next step's send.
    if (m.step + 1 < steps) postSend(m);
  }
  for (auto& s : sends) s->wait(deadline);
}

}  // namespace hvdtorch
