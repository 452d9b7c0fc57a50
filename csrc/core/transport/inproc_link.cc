#include "transport/inproc_link.h"

#include <cstring>

#include "common/error.h"

namespace hvdtorch {

namespace {

class DoneRequest : public LinkRequest {
 public:
  void wait(Deadline) override {}
};

class InProcRecv : public LinkRequest {
 public:
  InProcRecv(std::mutex& mu, std::condition_variable& cv, std::map<uint64_t, std::vector<char>>& arrived, uint64_t seq,
             void* dst, size_t bytes, std::shared_ptr<bool> closed, int self, int peer)
      : mu_(mu),
        cv_(cv),
        arrived_(arrived),
        seq_(seq),
        dst_(dst),
        bytes_(bytes),
        closed_(std::move(closed)),
        self_(self),
        peer_(peer) {}

  void wait(Deadline deadline) override {
    if (done_) return;
    std::unique_lock<std::mutex> lock(mu_);
    while (arrived_.count(seq_) == 0) {
      if (*closed_) throw PeerClosed(strCat("rank ", self_, ": link to rank ", peer_, " closed"));
      if (cv_.wait_until(lock, deadline.at()) == std::cv_status::timeout && arrived_.count(seq_) == 0)
        throw TimeoutError(strCat("rank ", self_, ": timed out receiving from rank ", peer_));
    }
    auto it = arrived_.find(seq_);
    if (it->second.size() != bytes_)
      throw CollectiveError(strCat("rank ", self_, ": message from rank ", peer_, " has ", it->second.size(),
                                   " bytes, expected ", bytes_));
    if (bytes_ > 0) std::memcpy(dst_, it->second.data(), bytes_);
    arrived_.erase(it);
    done_ = true;
  }

 private:
  std::mutex& mu_;
  std::condition_variable& cv_;
  std::map<uint64_t, std::vector<char>>& arrived_;
  uint64_t seq_;
  void* dst_;
  size_t bytes_;
  std::shared_ptr<bool> closed_;
  int self_, peer_;
  bool done_ = false;
};

}  // namespace

class InProcLink : public Link {
 public:
  InProcLink(InProcFabric& fabric, int self, int peer) : fabric_(fabric), self_(self), peer_(peer) {}
  int peer() const override { return peer_; }
  const char* kind() const override { return "inproc"; }

  std::unique_ptr<LinkRequest> isend(const void* data, size_t bytes) override {
    auto& ch = fabric_.channel(self_, peer_);
    {
      std::lock_guard<std::mutex> lock(ch.mu);
      const char* p = static_cast<const char*>(data);
      ch.arrived.emplace(ch.next_send++, std::vector<char>(p, p + bytes));
    }
    ch.cv.notify_all();
    return std::make_unique<DoneRequest>();
  }

  std::unique_ptr<LinkRequest> irecv(void* data, size_t bytes) override {
    auto& ch = fabric_.channel(peer_, self_);
    uint64_t seq;
    {
      std::lock_guard<std::mutex> lock(ch.mu);
      seq = ch.next_recv++;
    }
    return std::make_unique<InProcRecv>(ch.mu, ch.cv, ch.arrived, seq, data, bytes, fabric_.closed_, self_, peer_);
  }

 private:
  InProcFabric& fabric_;
  int self_, peer_;
};

InProcFabric::InProcFabric(int size) : size_(size), closed_(std::make_shared<bool>(false)) {
  for (int i = 0; i < size * size; ++i) channels_.push_back(std::make_unique<Channel>());
}

std::unique_ptr<Link> InProcFabric::link(int self, int peer) { return std::make_unique<InProcLink>(*this, self, peer); }

void InProcFabric::close() {
  for (auto& ch : channels_) {
    std::lock_guard<std::mutex> lock(ch->mu);
    *closed_ = true;
  }
  for (auto& ch : channels_) ch->cv.notify_all();
}

}  // namespace hvdtorch
