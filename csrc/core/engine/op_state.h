// Completion state of one submitted operation, shared between the engine
// (which completes it) and the caller (which polls or waits through a
// handle). Outputs allocated by the engine (allgather, alltoall,
// reducescatter) are published here.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace hvdtorch {

class OpState {
 public:
  void complete(std::vector<TensorPtr> outputs = {}) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
      outputs_ = std::move(outputs);
      done_ = true;
    }
    cv_.notify_all();
  }
  void fail(const std::string& error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
      error_ = error;
      done_ = true;
    }
    cv_.notify_all();
  }
  bool done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  // True when done within `d`.
  bool waitFor(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, d, [&] { return done_; });
  }
  const std::string& error() const { return error_; }        // valid once done
  const std::vector<TensorPtr>& outputs() const { return outputs_; }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string error_;
  std::vector<TensorPtr> outputs_;
};

}  // namespace hvdtorch
