// A point in time after which a wait gives up. Every blocking call in the core
// takes one, so that a dead or diverged peer turns into an error, not a hang.
#pragma once

#include <algorithm>
#include <chrono>

namespace hvdtorch {

// The one grace of the failure protocol, a quarter of the timeout, at most
// 1 s: how much longer than a peer a rank waits for what that peer relays
// (its result, or its last word naming the rank that stalled it:
// Context::relayGrace), how long a rank keeps its links open after its last
// word, and how long a unit whose link closed waits for the cause
// (reasonGrace, engine/engine_state.h). One rule, because each wait is
// sized to let the other side's word arrive.
inline std::chrono::milliseconds peerGrace(std::chrono::milliseconds timeout) {
  return std::min<std::chrono::milliseconds>(timeout / 4, std::chrono::seconds(1));
}

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  static Deadline after(std::chrono::milliseconds d) { return Deadline(Clock::now() + d); }
  static Deadline never() { return Deadline(Clock::time_point::max()); }

  bool expired() const { return Clock::now() >= at_; }
  // This deadline `more` later ("never" stays never).
  Deadline extendedBy(std::chrono::milliseconds more) const {
    return at_ == Clock::time_point::max() ? *this : Deadline(at_ + more);
  }
  Clock::time_point at() const { return at_; }
  // Time left, clamped at zero; "never" returns a very large value.
  std::chrono::milliseconds remaining() const {
    if (at_ == Clock::time_point::max()) return std::chrono::hours(24 * 365);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now());
    return left.count() > 0 ? left : std::chrono::milliseconds(0);
  }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

// The deadline of the operation this thread is running, while an
// OperationDeadline lives on it (the executor sets one per unit it runs).
// Context::deadline() returns it, so every wait of one operation (a node
// barrier, each ring step, a link receive) ends at the same moment: a wait
// that begins after another timed out does not get a fresh timeout, and a
// fault costs every rank at most the timeout, not a timeout per wait along
// a chain of ranks waiting for each other. Scopes nest (the outer one comes
// back at the end of the inner); not copyable.
class OperationDeadline {
 public:
  explicit OperationDeadline(Deadline deadline) : deadline_(deadline), outer_(current_) { current_ = this; }
  ~OperationDeadline() { current_ = outer_; }
  OperationDeadline(const OperationDeadline&) = delete;
  OperationDeadline& operator=(const OperationDeadline&) = delete;

  // This thread's innermost operation deadline, or null outside any.
  static const Deadline* current() { return current_ ? &current_->deadline_ : nullptr; }

 private:
  Deadline deadline_;
  OperationDeadline* outer_;
  static thread_local OperationDeadline* current_;
};

inline thread_local OperationDeadline* OperationDeadline::current_ = nullptr;

}  // namespace hvdtorch
