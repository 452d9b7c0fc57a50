#include "c10d_deadline_watch.h"

#include <algorithm>

#include "common/thread_placement.h"

namespace hvdtorch {

namespace {

// Gloo's own timeout stays as a backstop, far enough past the deadline that
// the watch always aborts first, even on a machine too busy to run it on
// time for a while.
constexpr std::chrono::milliseconds kBackstop = std::chrono::seconds(60);

}  // namespace

DeadlineWatch::~DeadlineWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool DeadlineWatch::wait(const c10::intrusive_ptr<c10d::Work>& work, Deadline deadline) {
  Key key;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    // At least a millisecond from now, as Gloo's own timeout was: a message
    // already here when the deadline has passed is still taken.
    key = Key(std::max(deadline.at(), Deadline::Clock::now() + std::chrono::milliseconds(1)), next_id_++);
    const bool earliest = armed_.empty() || key < armed_.begin()->first;
    armed_.emplace(key, work);
    if (earliest) cv_.notify_all();
  }
  struct Disarm {  // also when the wait throws
    DeadlineWatch& w;
    Key key;
    ~Disarm() {
      std::lock_guard<std::mutex> lock(w.mu_);
      w.armed_.erase(key);
    }
  } disarm{*this, key};
  // An abort that comes after the work completed makes Gloo's wait return
  // false all the same: at the deadline, a message that arrived just then
  // counts as late.
  return work->wait(std::max(deadline.remaining(), std::chrono::milliseconds(1)) + kBackstop);
}

void DeadlineWatch::run() {
  placeEngineThread("hvd-deadlines");
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (armed_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const auto next = armed_.begin();
    if (next->first.first == Deadline::Clock::time_point::max()) {
      cv_.wait(lock);  // only waits without a deadline (a wait_until that far could overflow)
      continue;
    }
    if (Deadline::Clock::now() < next->first.first) {
      cv_.wait_until(lock, next->first.first);
      continue;
    }
    c10::intrusive_ptr<c10d::Work> work = std::move(next->second);
    armed_.erase(next);
    work->abort();  // Gloo's abort only sets a flag and wakes the waiter: safe under the lock
  }
}

}  // namespace hvdtorch
