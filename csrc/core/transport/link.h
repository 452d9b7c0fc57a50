// A Link is a point-to-point, ordered byte channel to one peer.
//
// Contract (every implementation keeps it):
//  * Messages in one direction are matched in posting order: the k-th isend()
//    on A's link to B fills the k-th irecv() on B's link to A. Sizes of the
//    matched pair must be equal.
//  * Several isend()/irecv() may be outstanding at once; each completes
//    independently and must be waited on (or the link destroyed) before its
//    buffer is reused or freed.
//  * wait() either returns with the transfer complete, or throws
//    TimeoutError when the deadline passes, or CollectiveError when the peer
//    is gone: PeerClosed when all the transport knows is that the connection
//    closed (the peer may be alive and have closed on purpose), plain
//    CollectiveError when it knows the peer died. It never blocks past the
//    deadline.
//  * A link is used by one thread at a time (the engine's executor or the
//    control thread), so implementations need no internal locking for posts.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "common/deadline.h"

namespace hvdtorch {

class LinkRequest {
 public:
  virtual ~LinkRequest() = default;
  virtual void wait(Deadline deadline) = 0;
};

class Link {
 public:
  virtual ~Link() = default;

  virtual int peer() const = 0;
  // Short name of the transport ("c10d", "shm", "inproc") for logs and tests.
  virtual const char* kind() const = 0;

  virtual std::unique_ptr<LinkRequest> isend(const void* data, size_t bytes) = 0;
  virtual std::unique_ptr<LinkRequest> irecv(void* data, size_t bytes) = 0;

  void send(const void* data, size_t bytes, Deadline deadline) { isend(data, bytes)->wait(deadline); }
  void recv(void* data, size_t bytes, Deadline deadline) { irecv(data, bytes)->wait(deadline); }

  // Keeps `buffer` alive as long as this link: the buffer of a transfer
  // given up after an error, which the transport may hold until the link
  // is destroyed (see the contract above). Freed after the transport (a
  // base-class member outlives the derived class's state).
  void keepWhileOpen(std::unique_ptr<char[]> buffer) { kept_.push_back(std::move(buffer)); }

 private:
  std::vector<std::unique_ptr<char[]>> kept_;
};

}  // namespace hvdtorch
