// A point in time after which a wait gives up. Every blocking call in the core
// takes one, so that a dead or diverged peer turns into an error, not a hang.
#pragma once

#include <chrono>

namespace hvdtorch {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  static Deadline after(std::chrono::milliseconds d) { return Deadline(Clock::now() + d); }
  static Deadline never() { return Deadline(Clock::time_point::max()); }

  bool expired() const { return Clock::now() >= at_; }
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

}  // namespace hvdtorch
