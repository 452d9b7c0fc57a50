#include "engine/control_plane.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/error.h"

namespace hvdtorch {

// A message is one fixed-size frame (length + the first bytes), followed by
// a second message with the rest only when it does not fit: in steady state
// (response-cache bits only) every exchange is one message each way.
namespace {
constexpr size_t kFrame = 4096;
constexpr size_t kInline = kFrame - sizeof(uint64_t);
// No control message comes near this (a cycle's requests are names and
// shapes); a length past it is a corrupt frame, not a reason to allocate.
constexpr uint64_t kMaxMessage = uint64_t(64) << 20;
}  // namespace

void ControlPlane::sendBytes(Link& link, const std::vector<char>& bytes, Deadline d) {
  char frame[kFrame];
  const uint64_t n = bytes.size();
  std::memcpy(frame, &n, sizeof n);
  const size_t first = std::min<size_t>(n, kInline);
  if (first > 0) std::memcpy(frame + sizeof n, bytes.data(), first);
  auto head = link.isend(frame, kFrame);
  if (n > first) link.send(bytes.data() + first, n - first, d);
  head->wait(d);
}

std::vector<char> ControlPlane::recvBytes(Link& link, Deadline d) {
  char frame[kFrame];
  link.recv(frame, kFrame, d);
  uint64_t n = 0;
  std::memcpy(&n, frame, sizeof n);
  if (n > kMaxMessage)
    throw CollectiveError(
        strCat("corrupt control message from rank ", link.peer(), " (length ", n, " > ", kMaxMessage, ")"));
  std::vector<char> bytes(n);
  const size_t first = std::min<size_t>(n, kInline);
  if (first > 0) std::memcpy(bytes.data(), frame + sizeof n, first);
  if (n > first) link.recv(bytes.data() + first, n - first, d);
  return bytes;
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
        return recvBytes(root, Deadline::after(std::chrono::milliseconds(200)));
      } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): no reply; the send error follows
      }
      throw;
    }
    // Rank 0 gathers with the plain deadline; waiting a little longer here
    // lets its last word (sendLastWord), naming the rank that stalled or
    // died, arrive before this rank gives up and can only blame rank 0.
    const auto grace = std::min<std::chrono::milliseconds>(ctx_.timeout() / 4, std::chrono::seconds(1));
    return recvBytes(root, Deadline::after(ctx_.timeout() + grace));
  }
  std::vector<std::vector<char>> all(p);
  all[0] = std::move(mine);
  for (int r = 1; r < p; ++r) all[r] = recvBytes(ctx_.link(r), ctx_.deadline());
  std::vector<char> reply = decide(all);
  for (int r = 1; r < p; ++r) sendBytes(ctx_.link(r), reply, ctx_.deadline());
  return reply;
}

void ControlPlane::sendLastWord(const std::vector<char>& last, std::chrono::milliseconds within) {
  const Deadline d = Deadline::after(within);
  for (int r = 1; r < ctx_.size(); ++r) {
    Link* link = ctx_.openLink(r);  // never create a link now: that could wait for a dead peer
    if (link == nullptr) continue;
    try {
      sendBytes(*link, last, d);
    } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch)
      // That rank is gone or stuck; the others still deserve the message.
    }
  }
}

}  // namespace hvdtorch
