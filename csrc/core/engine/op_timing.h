// Where one op's latency goes: a timestamp at every hand-off between the
// threads it passes through, and a bounded log of the last ops' phases.
//
//   caller: binding entered -> submitted (queued for the control thread)
//   control thread: picked up -> negotiated (the op is ready everywhere)
//   executor: started -> reduce begun -> reduce ended -> completed
//   caller: woken (its wait returned)
//
// Always on: a stamp is one steady_clock read (tens of nanoseconds), against
// op latencies of microseconds. Each stamp is written by the thread that
// owns the op at that point, and read only after the caller's wait
// returned, so the queue and state locks order every write before the read.
// Ops that fail, fuse several entries into one unit, or are never waited
// for through the binding still get stamps, but only ops waited for
// through a handle are logged.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace hvdtorch {

struct OpTimes {
  using Clock = std::chrono::steady_clock;
  Clock::time_point bound;         // the binding started building the op
  Clock::time_point submitted;     // Engine::submit queued it for the control thread
  Clock::time_point picked;        // the control thread took it from the queue
  Clock::time_point negotiated;    // negotiation found it ready on every rank
  Clock::time_point started;       // the executor (or the control thread, inline) began its unit
  Clock::time_point reduce_begun;  // the reducer was called
  Clock::time_point reduce_ended;  // the reducer returned
  Clock::time_point completed;     // the op's state turned done
  Clock::time_point woken;         // the caller's wait returned

  static Clock::time_point now() { return Clock::now(); }
};

// One op's phases, in nanoseconds; -1 where a stamp is missing (an op type
// without a reducer, or an op the binding did not build).
struct OpPhases {
  int64_t binding = -1;        // bound -> submitted: building the entry, queueing it
  int64_t control_wake = -1;   // submitted -> picked: the control thread waking up
  int64_t negotiate = -1;      // picked -> negotiated: the AND (includes waiting for peers to submit)
  int64_t executor_wake = -1;  // negotiated -> started: the hand-off to the executor
  int64_t copy_in = -1;        // started -> reduce_begun: fusion copy / prescale into the output
  int64_t reduce = -1;         // reduce_begun -> reduce_ended: the reducer itself
  int64_t finish = -1;         // reduce_ended -> completed: copy out, average, completion hook
  int64_t waiter_wake = -1;    // completed -> woken: the caller's wait waking up

  static OpPhases of(const OpTimes& t) {
    auto span = [](OpTimes::Clock::time_point a, OpTimes::Clock::time_point b) -> int64_t {
      if (a == OpTimes::Clock::time_point{} || b == OpTimes::Clock::time_point{}) return -1;
      return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
    };
    OpPhases p;
    p.binding = span(t.bound, t.submitted);
    p.control_wake = span(t.submitted, t.picked);
    p.negotiate = span(t.picked, t.negotiated);
    p.executor_wake = span(t.negotiated, t.started);
    p.copy_in = span(t.started, t.reduce_begun);
    p.reduce = span(t.reduce_begun, t.reduce_ended);
    p.finish = span(t.reduce_ended, t.completed);
    p.waiter_wake = span(t.completed, t.woken);
    return p;
  }
};

// The phases of the last kCapacity ops waited for, oldest first. Thread-safe.
class LatencyLog {
 public:
  static constexpr size_t kCapacity = 4096;

  void add(const OpTimes& t) {
    const OpPhases p = OpPhases::of(t);
    std::lock_guard<std::mutex> lock(mu_);
    if (ring_.size() < kCapacity) {
      ring_.push_back(p);
    } else {
      ring_[next_] = p;
    }
    next_ = (next_ + 1) % kCapacity;
  }
  std::vector<OpPhases> snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (ring_.size() < kCapacity) return ring_;
    std::vector<OpPhases> out(ring_.begin() + static_cast<std::ptrdiff_t>(next_), ring_.end());
    out.insert(out.end(), ring_.begin(), ring_.begin() + static_cast<std::ptrdiff_t>(next_));
    return out;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    ring_.clear();
    next_ = 0;
  }

 private:
  mutable std::mutex mu_;
  std::vector<OpPhases> ring_;
  size_t next_ = 0;
};

}  // namespace hvdtorch
