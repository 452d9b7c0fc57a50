// Waiting on a condition that another process makes true through shared
// memory: spin a little, then sleep on a futex in short slices.
//
// "A little" is kSpins pauses, plus, when set (setShmSpinBudget), spinning
// for up to a time budget. Waking a futex sleeper costs the waker a system
// call and the sleeper a trip through the scheduler (on a virtual machine
// an idle vCPU must be woken by the host): tens of microseconds under load,
// which dominated a small all-reduce, where the peer typically arrives
// within a few microseconds. The budget is for processes that each have a
// core of their own: spinning next to the very process one waits for only
// delays it, so the engine leaves the budget at zero when the host's ranks
// outnumber its cores.
//
// Why this shape: the machines we run on are often oversubscribed (several
// ranks per core, or other jobs), so a waiter must give its core to the
// process it waits for after a few microseconds; a futex sleep costs nothing
// while idle and wakes at once when notified. There is deliberately no
// sched_yield() phase: next to CPU-bound processes a yield hands over a whole
// time slice (milliseconds), which made barrier-heavy runs ~20x slower in our
// measurements, while a woken futex sleeper is scheduled promptly. The sleep
// is cut into slices of at most kSleepSlice so that deadlines and peer
// liveness are checked even if a wake were ever missed.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "common/deadline.h"
#include "common/error.h"

namespace hvdtorch {

// A wake-up channel living in shared memory. All-zero bytes is its initial
// state, so it needs no constructor once the segment is mapped.
//
// Protocol (why no wake is lost): the notifier first makes its condition
// true, then bumps `seq` and wakes only if `sleepers` is non-zero; the waiter
// registers in `sleepers`, reads `seq`, re-checks its condition and only then
// sleeps on `seq` with the value it read. All four steps are seq_cst, so
// either the notifier sees the sleeper, or the sleeper sees the new `seq`
// (and the kernel refuses to sleep on a stale value).
struct alignas(64) ShmSignal {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> sleepers;

  void notify();
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be lock-free");
static_assert(sizeof(std::atomic<uint32_t>) == 4, "futex words are 32 bits");

// Process-wide; 0 (the default) means kSpins pauses only.
void setShmSpinBudget(std::chrono::microseconds budget);
std::chrono::microseconds shmSpinBudget();

namespace shm_detail {
void cpuRelax();
// Sleeps while *word == expected, at most `timeout` (spurious returns are fine).
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout);
}  // namespace shm_detail

struct ShmWaitTuning {
  // ~100 pause instructions are a few microseconds: enough to catch a peer
  // that is running right now, short enough not to steal a shared core.
  static constexpr int kSpins = 128;
  // Within a spin budget, the clock is read once per this many pauses.
  static constexpr int kSpinsPerClockRead = 32;
  static constexpr std::chrono::milliseconds kSleepSlice{1};
  // How often a long wait asks whether the peer is still there (reads /proc).
  static constexpr std::chrono::milliseconds kProbeInterval{100};
};

// Why an awaited peer will never deliver (empty while it still may).
// `closed`: it left on purpose rather than died, so it may say why on the
// control plane; thrown as PeerClosed then (common/error.h).
struct ShmGone {
  ShmGone() = default;
  ShmGone(std::string w, bool c = false) : why(std::move(w)), closed(c) {}  // NOLINT(google-explicit-constructor)
  bool empty() const { return why.empty(); }
  [[noreturn]] void raise() const {
    if (closed) throw PeerClosed(why);
    throw CollectiveError(why);
  }
  std::string why;
  bool closed = false;
};

// Blocks until ready() returns true.
//  * ready(): cheap check of the condition (atomic loads only).
//  * probe(): called every kProbeInterval while waiting; returns an empty
//    string while the awaited party may still deliver, otherwise the reason
//    it never will ("rank 0: peer rank 1 (pid 42) died", a ShmGone), which
//    is thrown (ShmGone::raise) unless ready() has become true meanwhile (a
//    peer may finish its part and then exit).
//  * describe(waited): the TimeoutError message when the deadline passes.
template <typename Ready, typename Probe, typename Describe>
void shmWait(ShmSignal& sig, Deadline deadline, Ready&& ready, Probe&& probe, Describe&& describe) {
  if (ready()) return;
  for (int i = 0; i < ShmWaitTuning::kSpins; ++i) {
    shm_detail::cpuRelax();
    if (ready()) return;
  }
  using Clock = std::chrono::steady_clock;
  if (const auto budget = shmSpinBudget(); budget.count() > 0) {
    const auto until = Clock::now() + budget;
    do {
      for (int i = 0; i < ShmWaitTuning::kSpinsPerClockRead; ++i) {
        shm_detail::cpuRelax();
        if (ready()) return;
      }
    } while (Clock::now() < until);
  }
  const auto start = Clock::now();
  auto next_probe = start + ShmWaitTuning::kProbeInterval;
  for (;;) {
    sig.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = sig.seq.load(std::memory_order_seq_cst);
    if (ready()) {
      sig.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      return;
    }
    const auto left = deadline.remaining();
    if (left.count() > 0) {
      shm_detail::futexWait(&sig.seq, seen, std::min<std::chrono::microseconds>(left, ShmWaitTuning::kSleepSlice));
    }
    sig.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (ready()) return;
    const auto now = Clock::now();
    if (now >= next_probe) {
      next_probe = now + ShmWaitTuning::kProbeInterval;
      const ShmGone gone = probe();
      if (!gone.empty()) {
        if (ready()) return;
        gone.raise();
      }
    }
    if (deadline.expired()) {
      if (ready()) return;
      // A dead peer is the better explanation of a timeout: say so if it is.
      const ShmGone gone = probe();
      if (!gone.empty()) gone.raise();
      throw TimeoutError(describe(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start)));
    }
  }
}

}  // namespace hvdtorch
