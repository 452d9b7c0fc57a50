// The control plane's transport. Two exchanges, both over framed messages
// (control_frame.h):
//  * exchange(): the star. Every rank sends its RankMessage to rank 0 and
//    receives the ResponseList back; rank 0 runs the coordinator.
//  * andAll(): the decentralized steady state (bit_allreduce.h). Every rank
//    obtains the bitwise AND of every rank's vector in O(log p) messages,
//    with no coordinator.
// It runs over its own links (a separate process group from the data), so negotiation of the
// next cycle overlaps execution of the previous one without the two ever
// interleaving on one channel.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "engine/negotiation/bit_allreduce.h"
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

  // The AND of `words` over every rank, in place (hosts first, through
  // shared memory, then one rank per host). Every rank calls it with
  // vectors of the same length at the same point of the cycle. A peer's last
  // word instead of its vector throws PeerStopped.
  void andAll(std::vector<uint64_t>& words, BitAllreduceCost* cost = nullptr);

  // Once an exchange has failed (a peer died or timed out): posts `last`
  // (a ResponseList with shutdown set, naming the cause; it must fit one
  // frame) as a last-word frame to every rank whose link is open, so that
  // the survivors learn the real cause wherever they wait for this rank
  // (rank 0's reply in the star, a vector in the AND), instead of seeing
  // only that it went away. Returns at once: the sends complete as the
  // peers read them, while the links stay open (the engine lingers before
  // closing them).
  void sendLastWord(const std::vector<char>& last);
  // Once the links are closed: lets go of the transfers sendLastWord left
  // pending (they hold on to the transport; their buffers stay until this
  // plane goes away).
  void dropPosted();

 private:
  static void sendBytes(Link& link, const std::vector<char>& bytes, Deadline d);
  Context& ctx_;
  // sendLastWord's transfers, kept until the links close (the engine
  // closes its contexts before it destroys this plane).
  struct Posted {
    std::unique_ptr<char[]> buffer;
    std::unique_ptr<LinkRequest> request;
  };
  std::vector<Posted> posted_;
};

}  // namespace hvdtorch
