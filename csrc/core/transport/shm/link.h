// A Link between two processes on the same host, through shared memory.
//
// One ShmSegment per unordered pair of ranks, named
// "<prefix>-l<lower>-<higher>": the lower rank creates it, the higher rank
// opens it (waiting up to `timeout` for it to appear). It holds two ShmRings,
// one per direction. Every message is framed by an 8-byte length, so a
// send/recv size mismatch is reported instead of desynchronising the stream;
// messages of any size (0, and larger than the ring) stream through in pieces.
//
// Progress and completion (why there is a sender thread and staging):
// algorithms post sends to one peer and then block on something else — the
// ring waits on receives from its left while its sends to the right are
// unfinished, and waits on its oldest sends before posting any receive. A
// send that advanced only while the receiver's application was waiting on
// that very link would deadlock such patterns as soon as messages exceed the
// ring. So sends behave like the in-process fabric's (eager, buffered):
//  * isend() copies what fits into the ring at once (small messages complete
//    right there, with no thread involved);
//  * the rest is queued for this link's sender thread (started on first
//    need), which streams queued sends in posting order, sleeping on a futex
//    while the ring is full;
//  * a send's wait() returns once the caller's buffer is free: all of it is
//    in the ring, or the unsent tail has been staged (copied) for the sender
//    thread. It waits only for the peer to have attached, never for the
//    peer's application. Staging costs one extra copy of what the receiver
//    has not taken yet, and memory for it until delivered;
//  * the destructor delivers staged data before closing (bounded by
//    `timeout`, cut short if the peer dies or leaves), so "sent" stays true
//    at shutdown; not while an exception unwinds, when failing fast wins;
//  * receives are pulled by the caller: irecv() takes what has arrived, and
//    wait() drains the receive queue in posting order until its own request
//    is complete, sleeping on a futex while the ring is empty.
//
// Failure: every wait honours its deadline (TimeoutError naming both ranks,
// the byte counts and the segment); a peer that died (kill -9 included) or
// destroyed its end is detected within ~100 ms (CollectiveError). A request
// destroyed before completion makes that direction unusable (later requests
// fail) rather than letting the stream slip out of step with the peer.
// A send failure found after the send's wait returned (peer died while its
// data was staged) surfaces on the next operation on the link.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "transport/link.h"

namespace hvdtorch {

struct ShmLinkConfig {
  std::string prefix;                   // job-unique, e.g. makeShmPrefix(run_id)
  size_t ring_bytes = size_t(4) << 20;  // per direction
  // How long the higher rank waits for the segment, and the destructor for
  // staged data to be delivered.
  std::chrono::milliseconds timeout{30000};
};

// "<prefix>-l<min(a,b)>-<max(a,b)>"
std::string shmLinkName(const std::string& prefix, int a, int b);

class ShmLink : public Link {
 public:
  // The lower rank creates the segment and returns at once; the higher rank
  // waits up to cfg.timeout for it (TimeoutError).
  ShmLink(const ShmLinkConfig& cfg, int self, int peer);
  ~ShmLink() override;

  int peer() const override;
  const char* kind() const override { return "shm"; }
  std::unique_ptr<LinkRequest> isend(const void* data, size_t bytes) override;
  std::unique_ptr<LinkRequest> irecv(void* data, size_t bytes) override;

  struct State;  // shared with outstanding requests and the sender thread

 private:
  std::shared_ptr<State> state_;
};

// The factory Context wants for its local links:
//   Context(topo, remote, [cfg, r](int p) { return makeShmLink(cfg, r, p); }, ...)
std::unique_ptr<Link> makeShmLink(const ShmLinkConfig& cfg, int self, int peer);

}  // namespace hvdtorch
