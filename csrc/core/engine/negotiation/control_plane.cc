#include "engine/negotiation/control_plane.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/error.h"
#include "engine/negotiation/control_frame.h"

namespace hvdtorch {

void ControlPlane::sendBytes(Link& link, const std::vector<char>& bytes, Deadline d) {
  sendFrame(link, FrameKind::kMessage, bytes.data(), bytes.size(), d);
}

std::vector<char> ControlPlane::exchange(std::vector<char> mine, const Decide& decide) {
  const int p = ctx_.size();
  if (ctx_.rank() != 0) {
    Link& root = ctx_.link(0);
    try {
      sendBytes(root, mine, ctx_.deadline());
    } catch (const std::exception&) {
      // Rank 0 may have stopped right after its last word (sendLastWord):
      // that reply, if it is already here, says why; prefer it to "closed".
      try {
        return recvFrame(root, Deadline::after(std::chrono::milliseconds(200))).payload;
      } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): no reply; the send error follows
      }
      throw;
    }
    // Rank 0 gathers with the plain deadline; waiting a little longer here
    // lets its last word (sendLastWord), naming the rank that stalled or
    // died, arrive before this rank gives up and can only blame rank 0.
    // A last word from rank 0 is a ResponseList too (shutdown set, naming
    // the cause): the caller handles it like any shutdown.
    return recvFrame(root, ctx_.deadline().extendedBy(ctx_.relayGrace())).payload;
  }
  std::vector<std::vector<char>> all(p);
  all[0] = std::move(mine);
  for (int r = 1; r < p; ++r) all[r] = messageOf(recvFrame(ctx_.link(r), ctx_.deadline()), r);
  std::vector<char> reply = decide(all);
  for (int r = 1; r < p; ++r) sendBytes(ctx_.link(r), reply, ctx_.deadline());
  return reply;
}

void ControlPlane::andAll(std::vector<uint64_t>& words, BitAllreduceCost* cost) {
  bitAndAllreduce(ctx_, words, ctx_.deadline(), BitAllreduceShape::kHierarchical, cost);
}

void ControlPlane::sendLastWord(const std::vector<char>& last) {
  const std::vector<char> frame = frameOf(FrameKind::kLastWord, last.data(), last.size());
  for (int r = 0; r < ctx_.size(); ++r) {
    if (r == ctx_.rank()) continue;
    Link* link = ctx_.openLink(r);  // never create a link now: that could wait for a dead peer
    if (link == nullptr) continue;
    try {
      // First take whatever that peer may be sending here (some transports
      // complete a send only once the receiver posts), so that it gets to
      // read the last word; then the last word itself. Nothing is waited
      // for: the buffers and requests stay here until the links close.
      Posted absorb{std::make_unique<char[]>(kFrameBytes), nullptr};
      absorb.request = link->irecv(absorb.buffer.get(), kFrameBytes);
      posted_.push_back(std::move(absorb));
      Posted word{std::make_unique<char[]>(kFrameBytes), nullptr};
      std::memcpy(word.buffer.get(), frame.data(), kFrameBytes);
      word.request = link->isend(word.buffer.get(), kFrameBytes);
      posted_.push_back(std::move(word));
    } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch)
      // That rank is gone; the others still deserve the message.
    }
  }
}

void ControlPlane::dropPosted() {
  for (auto& p : posted_) p.request.reset();
}

}  // namespace hvdtorch
