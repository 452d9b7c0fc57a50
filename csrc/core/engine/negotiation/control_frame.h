// The unit of traffic on the control links. Every control message (the
// star's RankMessage and ResponseList, the bit vectors of the decentralized
// AND) travels as one fixed-size frame: a header word, then up to kInline
// bytes of payload; a payload that does not fit follows as a second message.
// In steady state every message is therefore one frame.
//
// The header word holds the payload length (low 56 bits) and the frame's
// kind (top byte). A rank whose control thread stops on an error sends a
// kLastWord frame (a serialized ResponseList with shutdown set, naming the
// cause) to every peer it has a link to: whatever a peer was waiting for on
// that link (a reply in the star, a vector in the AND), it finds the last
// word in its place and can name the real cause instead of "connection
// closed" or a timeout on a healthy rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/deadline.h"
#include "common/error.h"
#include "transport/link.h"

namespace hvdtorch {

enum class FrameKind : uint8_t { kMessage = 0, kLastWord = 1 };

struct Frame {
  FrameKind kind = FrameKind::kMessage;
  std::vector<char> payload;
};

constexpr size_t kFrameBytes = 4096;
constexpr size_t kFrameInline = kFrameBytes - sizeof(uint64_t);

// Sends one message (one frame, plus the tail when it does not fit).
void sendFrame(Link& link, FrameKind kind, const void* payload, size_t n, Deadline d);
// One whole frame holding `payload` (at most kFrameInline bytes: throws
// InvalidArgument otherwise), for a caller that posts it itself.
std::vector<char> frameOf(FrameKind kind, const void* payload, size_t n);
// Receives one message. Throws CollectiveError for a corrupt header (unknown
// kind, length past any control message) naming the peer.
Frame recvFrame(Link& link, Deadline d);
// Sends `payload` to the link's peer and receives its message, both at
// once (the receive is posted before the send, so transports that complete
// a send only once the peer posted its receive cannot deadlock). The peer
// must call it too, at the same point of the traffic.
Frame exchangeFrames(Link& link, const void* payload, size_t n, Deadline d);

// A peer's last word where a message was expected (see above).
class PeerStopped;
// The payload of a kMessage frame; throws PeerStopped for a last word.
std::vector<char> messageOf(Frame f, int peer);

class PeerStopped : public CollectiveError {
 public:
  PeerStopped(int peer, std::vector<char> last_word, const std::string& what)
      : CollectiveError(what), peer_(peer), last_word_(std::move(last_word)) {}
  int peer() const { return peer_; }
  // The serialized ResponseList it sent.
  const std::vector<char>& lastWord() const { return last_word_; }

 private:
  int peer_;
  std::vector<char> last_word_;
};

}  // namespace hvdtorch
