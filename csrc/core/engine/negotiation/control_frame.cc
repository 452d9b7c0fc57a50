#include "engine/negotiation/control_frame.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "engine/request.h"

namespace hvdtorch {

namespace {

constexpr int kKindShift = 56;
constexpr uint64_t kLengthMask = (uint64_t(1) << kKindShift) - 1;
// No control message comes near this (a cycle's requests are names and
// shapes); a length past it is a corrupt frame, not a reason to allocate.
constexpr uint64_t kMaxMessage = uint64_t(64) << 20;

void encodeHead(char* frame, FrameKind kind, const void* payload, size_t n) {
  const uint64_t header = static_cast<uint64_t>(n) | (static_cast<uint64_t>(kind) << kKindShift);
  std::memcpy(frame, &header, sizeof header);
  const size_t first = std::min(n, kFrameInline);
  if (first > 0) std::memcpy(frame + sizeof header, payload, first);
}

// The frame's kind and payload length; the tail (if any) is still to come.
Frame decodeHead(const char* frame, int peer) {
  uint64_t header = 0;
  std::memcpy(&header, frame, sizeof header);
  const uint64_t kind = header >> kKindShift;
  const uint64_t n = header & kLengthMask;
  if (kind > static_cast<uint64_t>(FrameKind::kLastWord) || n > kMaxMessage)
    throw CollectiveError(strCat("corrupt control message from rank ", peer, " (kind ", kind, ", length ", n,
                                 "; at most ", kMaxMessage, ")"));
  Frame f;
  f.kind = static_cast<FrameKind>(kind);
  f.payload.resize(n);
  const size_t first = std::min<size_t>(n, kFrameInline);
  if (first > 0) std::memcpy(f.payload.data(), frame + sizeof header, first);
  return f;
}

size_t tailOf(size_t n) { return n > kFrameInline ? n - kFrameInline : 0; }

// Memory a posted transfer reads or fills. On an error the transfer may
// still be pending (a transport can keep a posted receive or send until its
// link closes, and a peer may yet answer it: a last word's absorbing
// receive, say), so the buffer is then given to the link (abandon()), which
// frees it when it is destroyed, instead of freed under the transport.
class Posted {
 public:
  Posted(Link& link, size_t n) : link_(&link), p_(n > 0 ? new char[n] : nullptr) {}
  ~Posted() { delete[] p_; }
  Posted(Posted&& o) noexcept : link_(o.link_), p_(o.p_) { o.p_ = nullptr; }
  Posted(const Posted&) = delete;
  Posted& operator=(const Posted&) = delete;
  Posted& operator=(Posted&&) = delete;
  char* get() const { return p_; }
  void abandon() {
    if (p_ != nullptr) link_->keepWhileOpen(std::unique_ptr<char[]>(p_));
    p_ = nullptr;
  }

 private:
  Link* link_;
  char* p_;
};

// Head frame, then the tail, in one buffer.
Posted encodeMessage(Link& link, FrameKind kind, const void* payload, size_t n) {
  Posted out(link, kFrameBytes + tailOf(n));
  encodeHead(out.get(), kind, payload, n);
  if (tailOf(n) > 0) std::memcpy(out.get() + kFrameBytes, static_cast<const char*>(payload) + kFrameInline, tailOf(n));
  return out;
}

void recvTail(Link& link, Frame& f, Deadline d) {
  const size_t tail = tailOf(f.payload.size());
  if (tail == 0) return;
  Posted in(link, tail);
  try {
    link.recv(in.get(), tail, d);
  } catch (...) {
    in.abandon();
    throw;
  }
  std::memcpy(f.payload.data() + kFrameInline, in.get(), tail);
}

}  // namespace

std::vector<char> frameOf(FrameKind kind, const void* payload, size_t n) {
  if (n > kFrameInline)
    throw InvalidArgument(strCat("a single control frame holds at most ", kFrameInline, " bytes, not ", n));
  std::vector<char> frame(kFrameBytes);
  encodeHead(frame.data(), kind, payload, n);
  return frame;
}

void sendFrame(Link& link, FrameKind kind, const void* payload, size_t n, Deadline d) {
  Posted out = encodeMessage(link, kind, payload, n);
  try {
    auto head = link.isend(out.get(), kFrameBytes);
    if (tailOf(n) > 0) link.send(out.get() + kFrameBytes, tailOf(n), d);
    head->wait(d);
  } catch (...) {
    out.abandon();
    throw;
  }
}

Frame recvFrame(Link& link, Deadline d) {
  Posted in(link, kFrameBytes);
  try {
    link.recv(in.get(), kFrameBytes, d);
  } catch (...) {
    in.abandon();
    throw;
  }
  Frame f = decodeHead(in.get(), link.peer());
  recvTail(link, f, d);
  return f;
}

Frame exchangeFrames(Link& link, const void* payload, size_t n, Deadline d) {
  Posted out = encodeMessage(link, FrameKind::kMessage, payload, n);
  Posted in(link, kFrameBytes);
  std::unique_ptr<LinkRequest> s;
  Frame f;
  try {
    auto r = link.irecv(in.get(), kFrameBytes);
    s = link.isend(out.get(), kFrameBytes);
    r->wait(d);
    f = decodeHead(in.get(), link.peer());
  } catch (...) {
    in.abandon();
    out.abandon();
    throw;
  }
  if (f.kind == FrameKind::kLastWord) {
    // The peer stopped. It posts a receive for one frame from every peer
    // (ControlPlane::sendLastWord), so the send completes even on
    // transports that wait for the receiver; if it does not, it is left.
    try {
      s->wait(Deadline::after(std::chrono::milliseconds(100)));
    } catch (const std::exception&) {
      out.abandon();
    }
    recvTail(link, f, d);
    return f;
  }
  try {
    // Tails (long vectors only) likewise: the receive posted first.
    Posted tail_in(link, tailOf(f.payload.size()));
    std::unique_ptr<LinkRequest> ti, to;
    try {
      if (tailOf(f.payload.size()) > 0) ti = link.irecv(tail_in.get(), tailOf(f.payload.size()));
      s->wait(d);
      if (tailOf(n) > 0) to = link.isend(out.get() + kFrameBytes, tailOf(n));
      if (ti) ti->wait(d);
      if (to) to->wait(d);
    } catch (...) {
      tail_in.abandon();
      throw;
    }
    if (ti) std::memcpy(f.payload.data() + kFrameInline, tail_in.get(), tailOf(f.payload.size()));
  } catch (...) {
    out.abandon();
    throw;
  }
  return f;
}

std::vector<char> messageOf(Frame f, int peer) {
  if (f.kind == FrameKind::kMessage) return std::move(f.payload);
  std::string why;
  try {
    const ResponseList last = ResponseList::parse(f.payload);
    why = last.shutdown_reason.empty() ? strCat("rank ", peer, " stopped") : last.shutdown_reason;
  } catch (const std::exception& e) {
    why = strCat("rank ", peer, " stopped (its last word did not decode: ", e.what(), ")");
  }
  throw PeerStopped(peer, std::move(f.payload), strCat("rank ", peer, " stopped: ", why));
}

}  // namespace hvdtorch
