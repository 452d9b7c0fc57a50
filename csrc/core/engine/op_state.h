// Completion state of one submitted operation, shared between the engine
// (which completes it) and the caller (which polls or waits through a
// handle). Outputs allocated by the engine (allgather, alltoall,
// reducescatter) are published here.
//
// Contract:
//  * complete() or fail() finishes the op exactly once; later calls are
//    ignored (a fused piece and a shutdown may race to finish it).
//  * The on-done hook, if set, runs once, before done() turns true and
//    before any waiter wakes. The engine uses it to release the op's name,
//    so a caller that resubmits the same name the moment wait() returns is
//    never told the name is still pending. The hook runs without this
//    state's lock held and must not call back into this state.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "engine/op_timing.h"
#include "engine/tensor.h"

namespace hvdtorch {

class OpState {
 public:
  // Set before the op is visible to any thread that may finish it.
  void setOnDone(std::function<void()> hook) { on_done_ = std::move(hook); }

  void complete(std::vector<TensorPtr> outputs = {}) { finish(std::move(outputs), ""); }
  void fail(const std::string& error) { finish({}, error.empty() ? "failed (no reason given)" : error); }

  bool done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  // True when done within `d`.
  bool waitFor(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, d, [&] { return done_; });
  }
  const std::string& error() const { return error_; }  // valid once done
  const std::vector<TensorPtr>& outputs() const { return outputs_; }

  // Hand-off timestamps (op_timing.h says who writes which, and when).
  OpTimes times;

  // For ops on a device: the device, and an event recorded on its engine
  // stream after the op's last write to its outputs. The framework makes
  // its own stream wait on it before using the outputs. Written before
  // complete(); read once done() is true.
  DeviceId device;
  std::shared_ptr<Event> completion;

 private:
  void finish(std::vector<TensorPtr> outputs, const std::string& error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finishing_) return;
      finishing_ = true;
    }
    if (on_done_) on_done_();
    {
      std::lock_guard<std::mutex> lock(mu_);
      times.completed = OpTimes::now();
      outputs_ = std::move(outputs);
      error_ = error;
      done_ = true;
    }
    cv_.notify_all();
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> on_done_;
  bool finishing_ = false;  // complete()/fail() has been called
  bool done_ = false;       // results published; waiters may read them
  std::string error_;
  std::vector<TensorPtr> outputs_;
};

}  // namespace hvdtorch
