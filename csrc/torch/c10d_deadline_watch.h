// Ends a c10d point-to-point wait at its deadline by aborting it, instead of
// handing Gloo the timeout.
//
// Why: a Gloo wait that times out closes every connection of its process
// group (UnboundBuffer::waitRecv/waitSend signal the whole transport
// context before they throw). On the control links that is wrong twice
// over: one stalled peer takes the links to all the healthy ones down with
// it, and with them the last word this rank owes them (control_plane.h), so
// a rank on another host reads "connection closed by rank 0" where rank 0
// knew which rank stalled. An aborted wait leaves the connection and the
// other peers' traffic alone.
//
// Contract: wait() returns true when the work completed before the
// deadline, false when the deadline passed first (the work is then aborted
// but still posted in the transport: the caller keeps the work, and so its
// buffer, alive as long as the link, since the message may yet arrive);
// it throws what the work throws (a closed connection). One thread per
// watch, started by the first wait and joined when the watch is destroyed
// (with the links that share it, when the engine closes them).
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "common/deadline.h"

namespace hvdtorch {

class DeadlineWatch {
 public:
  DeadlineWatch() = default;
  ~DeadlineWatch();
  DeadlineWatch(const DeadlineWatch&) = delete;
  DeadlineWatch& operator=(const DeadlineWatch&) = delete;

  bool wait(const c10::intrusive_ptr<c10d::Work>& work, Deadline deadline);

 private:
  using Key = std::pair<Deadline::Clock::time_point, uint64_t>;  // when, then the order armed
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, c10::intrusive_ptr<c10d::Work>> armed_;  // earliest deadline first
  uint64_t next_id_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace hvdtorch
