// The control plane's transport: once per cycle every rank sends its
// RankMessage to rank 0 and receives the ResponseList back. It runs over its
// own links (a separate process group from the data), so negotiation of the
// next cycle overlaps execution of the previous one without the two ever
// interleaving on one channel.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include "transport/context.h"

namespace hvdtorch {

class ControlPlane {
 public:
  explicit ControlPlane(Context& ctx) : ctx_(ctx) {}

  // Non-root ranks: send `mine`, return rank 0's reply (waiting up to the
  // timeout plus a grace of a quarter of it, at most 1 s, so that rank 0
  // times out first and can say on whom).
  // Rank 0: collect every rank's message (index = rank, its own included),
  // call `decide`, send the result to every rank and return it.
  using Decide = std::function<std::vector<char>(std::vector<std::vector<char>>&)>;
  std::vector<char> exchange(std::vector<char> mine, const Decide& decide);

  // Rank 0 only, once an exchange has failed (a peer died or timed out):
  // sends `last` to every rank whose link is open, as the reply to whatever
  // it sent, so that the survivors learn the real cause instead of seeing
  // only that rank 0 went away. Best effort: unreachable ranks are skipped,
  // and the whole call returns within `within`.
  void sendLastWord(const std::vector<char>& last, std::chrono::milliseconds within);

 private:
  void sendBytes(Link& link, const std::vector<char>& bytes, Deadline d);
  std::vector<char> recvBytes(Link& link, Deadline d);
  Context& ctx_;
};

}  // namespace hvdtorch
