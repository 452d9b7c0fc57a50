// Links between threads of one process: the transport of the C++ unit tests,
// which run p "ranks" as p threads so algorithms are tested without Python,
// torch or sockets. Sends are eager (copied at post time).
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/link.h"

namespace hvdtorch {

class InProcFabric {
 public:
  explicit InProcFabric(int size);
  std::unique_ptr<Link> link(int self, int peer);
  // Make every pending and future wait fail, as if the peers died.
  void close();
  int size() const { return size_; }

 private:
  friend class InProcLink;
  struct Channel {  // one direction, src -> dst
    std::mutex mu;
    std::condition_variable cv;
    std::map<uint64_t, std::vector<char>> arrived;  // by send sequence number
    uint64_t next_send = 0;
    uint64_t next_recv = 0;
  };
  Channel& channel(int src, int dst) { return *channels_[src * size_ + dst]; }

  int size_;
  std::vector<std::unique_ptr<Channel>> channels_;
  std::shared_ptr<bool> closed_;
};

}  // namespace hvdtorch
