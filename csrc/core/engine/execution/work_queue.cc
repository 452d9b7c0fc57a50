#include "engine/execution/work_queue.h"

#include "common/deadline.h"
#include "common/error.h"
#include "common/thread_placement.h"
#include "engine/op_spec.h"

namespace hvdtorch {

void WorkQueue::start() {
  thread_ = std::thread([this] {
    placeEngineThread("hvd-executor");
    loop();
  });
}

void WorkQueue::stop() {
  {
    std::lock_guard<std::mutex> lock(exec_mu_);
    stop_ = true;
  }
  exec_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void WorkQueue::stopping(bool clean) {
  if (clean) {
    // A clean stop, on every rank in this cycle: the device rings' teardown
    // handshake can rely on every peer taking part.
    std::lock_guard<std::mutex> lock(exec_mu_);
    close_rings_ = true;
  } else {
    release_ring_waits_fn_();
  }
  exec_cv_.notify_all();
}

bool WorkQueue::runsInline(const WorkUnit& unit) {
  if (!unit.error.empty()) return true;  // only fails its ops
  switch (unit.spec->inline_run) {
    case InlineRun::kIfSmall: return unit.bytes <= kInlineUnitBytes;
    case InlineRun::kAlways: return true;
    case InlineRun::kNever: break;
  }
  return false;
}

void WorkQueue::push(const std::shared_ptr<const UnitSite>& site, std::vector<WorkUnit> units) {
  size_t next = 0;
  // A small unit runs right here when the executor has nothing before it:
  // that saves the op a thread hand-off (a wake-up and a context switch)
  // worth more than the unit itself. Order is kept, because the executor
  // is idle and its queue empty, and only this thread queues. Large units
  // go to the executor, so that the next cycle's negotiation overlaps them.
  while (next < units.size() && runsInline(units[next])) {
    {
      std::lock_guard<std::mutex> lock(exec_mu_);
      if (!queue_.empty() || busy_) break;
      busy_ = true;
    }
    QueuedUnit item{site, std::move(units[next++])};
    runUnit(item);
    std::lock_guard<std::mutex> lock(exec_mu_);
    busy_ = false;
  }
  if (next == units.size()) return;
  {
    std::lock_guard<std::mutex> lock(exec_mu_);
    for (; next < units.size(); ++next) queue_.push_back({site, std::move(units[next])});
  }
  exec_cv_.notify_one();
}

void WorkQueue::failEverything(const std::string& why) {
  std::deque<EntryPtr> incoming;
  std::deque<QueuedUnit> queued;
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    if (st_.failure.empty()) st_.failure = why;
    incoming.swap(st_.incoming);
    st_.pending_names.clear();
  }
  {
    std::lock_guard<std::mutex> lock(exec_mu_);
    queued.swap(queue_);
  }
  // Each op's error names the op as well as the cause.
  for (auto& e : incoming) e->state->fail(strCat(e->request.describe(), ": ", why));
  for (auto& q : queued)
    for (auto& p : q.unit.pieces) p.entry->state->fail(strCat(p.entry->request.describe(), ": ", why));
  release_ring_waits_fn_();
}

void WorkQueue::settleHeld() {
  std::vector<HeldUnit> held;
  std::string cause;
  bool own = false;
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    if (held_.empty()) return;
    if (st_.failure.empty()) {
      if (!st_.stopped && std::chrono::steady_clock::now() < held_until_) return;
      // No cause came: the peer closed without a word (it died, most
      // likely). Blame it, as the first held unit saw it.
      st_.failure = held_.front().failed + held_.front().seen;
      own = true;
    }
    cause = st_.failure;
    held.swap(held_);
  }
  if (own) {
    failEverything(cause);
    st_.incoming_cv.notify_all();  // the control thread tells the other ranks
  }
  for (auto& h : held) {
    for (auto& p : h.item.unit.pieces) {
      if (h.seen.empty()) {
        p.entry->state->fail(strCat(p.entry->request.describe(), ": ", cause));
      } else if (own) {
        p.entry->state->fail(h.failed + h.seen);
      } else {
        p.entry->state->fail(strCat(h.failed, cause, " (then: ", h.seen, ")"));
      }
    }
  }
}

void WorkQueue::loop() {
  while (true) {
    QueuedUnit item;
    {
      std::unique_lock<std::mutex> lock(exec_mu_);
      const auto woken = [&] { return !queue_.empty() || stop_ || close_rings_; };
      if (settle_at_ == std::chrono::steady_clock::time_point::max()) {
        exec_cv_.wait(lock, woken);
      } else if (!exec_cv_.wait_until(lock, settle_at_, woken)) {
        // Units are held and their grace ended (the control thread may be
        // stuck in an exchange): settle them.
        settle_at_ = std::chrono::steady_clock::time_point::max();
        lock.unlock();
        settleHeld();
        continue;
      }
      if (queue_.empty() && close_rings_) {
        // Every rank stopped in the same cycle, after queueing the same units:
        // all ran, unless one failed here (then the links may be out of step).
        close_rings_ = false;
        lock.unlock();
        bool failed;
        {
          std::lock_guard<std::mutex> failure_lock(st_.mu);
          failed = !st_.failure.empty();
        }
        if (!failed) close_rings_fn_();
        continue;
      }
      if (queue_.empty()) return;  // stop requested and everything drained
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    runUnit(item);
    std::lock_guard<std::mutex> lock(exec_mu_);
    busy_ = false;
  }
}

void WorkQueue::runUnit(QueuedUnit& item) {
  WorkUnit& unit = item.unit;
  std::string failure;
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    failure = st_.failure;
    if (failure.empty() && !held_.empty()) {
      // A link closed under an earlier unit: this one would fail or stall
      // on it. It fails with that unit's cause.
      held_.push_back({std::move(item), "", ""});
      return;
    }
  }
  const Request& req = unit.pieces.front().entry->request;
  const int me = rank_;
  try {
    if (!failure.empty()) {
      for (auto& p : unit.pieces) p.entry->state->fail(strCat(p.entry->request.describe(), ": ", failure));
      return;
    }
    const auto started = OpTimes::now();
    for (auto& p : unit.pieces) p.entry->state->times.started = started;
    // Every wait of this unit ends by one deadline (common/deadline.h says why).
    const OperationDeadline deadline(Deadline::after(config_.timeout));
    item.site->executor->run(unit);
  } catch (const InvalidArgument& e) {
    for (auto& p : unit.pieces) p.entry->state->fail(strCat("rank ", me, ": ", e.what()));
  } catch (const std::exception& e) {
    const std::string& in_set = item.site->in_set;
    const std::string failed =
        strCat("rank ", me, ": ", opTypeName(unit.type), " '", req.name, "'", in_set, " failed: ");
    std::string cause;
    std::chrono::steady_clock::time_point settle_at{};
    {
      std::lock_guard<std::mutex> lock(st_.mu);
      cause = st_.failure;
      if (cause.empty() && !st_.stopped && dynamic_cast<const PeerClosed*>(&e) != nullptr) {
        // The peer may have closed because it learned of a failure
        // elsewhere, and its reason may still be on its way: hold the
        // unit until the control thread knows (settleHeld()).
        if (held_.empty()) held_until_ = std::chrono::steady_clock::now() + reasonGrace(config_);
        settle_at = held_until_;
        held_.push_back({std::move(item), failed, e.what()});
      }
    }
    if (settle_at != std::chrono::steady_clock::time_point{}) {
      {
        std::lock_guard<std::mutex> lock(exec_mu_);
        settle_at_ = settle_at;
      }
      exec_cv_.notify_all();
      st_.incoming_cv.notify_all();  // an idle control thread cycles now, and hears sooner
      return;
    }
    // A cause the control thread already knows leads; what this unit saw follows.
    const std::string why = cause.empty() ? failed + e.what() : strCat(failed, cause, " (then: ", e.what(), ")");
    for (auto& p : unit.pieces) p.entry->state->fail(why);
    failEverything(why);
    st_.incoming_cv.notify_all();  // the control thread tells the other ranks
  }
}

}  // namespace hvdtorch
