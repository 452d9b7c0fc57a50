#include "algorithms/ring_allreduce.h"

#include <algorithm>
#include <deque>

#include "algorithms/reduce_kernels.h"
#include "common/error.h"

namespace hvdtorch {

namespace {

// One message of the ring schedule: a segment of one chunk at one step.
struct Message {
  int step;        // 0 .. 2(p-1)-1; steps < p-1 are reduce-scatter
  size_t offset;   // element offset into the buffer
  size_t count;    // elements
};

// Appends chunk `chunk`'s segments, as messages of step `step`.
void appendSegments(std::vector<Message>& msgs, int step, int chunk, int p, size_t count, size_t seg_elems) {
  const Range r = evenSplit(count, p, chunk);
  for (size_t done = 0; done < r.count; done += seg_elems)
    msgs.push_back({step, r.offset + done, std::min(seg_elems, r.count - done)});
}

// The messages a rank at ring position `pos` receives, in order. The chunk
// received at step t is (pos - t - 1) mod p; the left neighbour sends exactly
// this sequence, so both sides agree on every message size.
std::vector<Message> scheduleFor(int pos, int p, size_t count, size_t seg_elems) {
  std::vector<Message> msgs;
  for (int step = 0; step < 2 * (p - 1); ++step)
    appendSegments(msgs, step, ((pos - step - 1) % p + p) % p, p, count, seg_elems);
  return msgs;
}

}  // namespace

void RingAllreduce::allreduce(Context& ctx, void* data, size_t count, DataType dtype, ReduceOp op) {
  std::vector<int> all(ctx.size());
  for (int r = 0; r < ctx.size(); ++r) all[r] = r;
  allreduceAmong(ctx, all, data, count, dtype, op);
}

void RingAllreduce::allreduceAmong(Context& ctx, const std::vector<int>& members, void* data,
                                   size_t count, DataType dtype, ReduceOp op) {
  const int p = static_cast<int>(members.size());
  if (p <= 1 || count == 0) return;
  const auto it = std::find(members.begin(), members.end(), ctx.rank());
  if (it == members.end())
    throw InvalidArgument(strCat("rank ", ctx.rank(), ": ring called on a group it is not in"));
  const int pos = static_cast<int>(it - members.begin());

  const size_t esize = dtypeSize(dtype);
  const size_t seg_elems = std::max<size_t>(1, opts_.segment_bytes / esize);
  const int window = std::max(1, opts_.window);
  char* base = static_cast<char*>(data);

  Link& right = ctx.link(members[(pos + 1) % p]);
  Link& left = ctx.link(members[(pos - 1 + p) % p]);
  const Deadline deadline = ctx.deadline();

  // What I send is what my right neighbour receives; what I receive, my own schedule.
  const std::vector<Message> recvs = scheduleFor(pos, p, count, seg_elems);
  std::vector<Message> sends_step0;  // my own chunk; later sends forward what arrives
  appendSegments(sends_step0, 0, pos, p, count, seg_elems);

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
    void* dst = (m.step < p - 1) ? static_cast<void*>(scratch_.data() + (next_post % window) * slot_bytes)
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
    if (m.step < p - 1) {
      reduceInto(base + m.offset * esize, scratch_.data() + (i % window) * slot_bytes, m.count, dtype, op);
    }
    // The slot is free again: keep the window full.
    if (next_post < recvs.size()) postRecv();
    // Forward what was just completed: it is the next step's send.
    if (m.step + 1 < 2 * (p - 1)) postSend(m);
  }
  for (auto& s : sends) s->wait(deadline);
}

}  // namespace hvdtorch
