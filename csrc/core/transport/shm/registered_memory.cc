#include "transport/shm/registered_memory.h"

#include <algorithm>

#include "common/error.h"

namespace hvdtorch {

RegisteredMemory::RegisteredMemory(std::string prefix, int rank, std::vector<int> host_ranks)
    : prefix_(std::move(prefix)), rank_(rank), host_ranks_(std::move(host_ranks)), registry_(new Registry) {
  if (std::find(host_ranks_.begin(), host_ranks_.end(), rank_) == host_ranks_.end())
    throw InvalidArgument(strCat("rank ", rank_, ": registered memory needs this rank among the host's ranks"));
}

// A peer killed before every rank of the host mapped its buffers leaves
// their names behind (ShmSegment's one leak); whoever of the host shuts down
// later removes them.
RegisteredMemory::~RegisteredMemory() { ShmSegment::removeStale(prefix_ + "-g"); }

std::string RegisteredMemory::segmentName(int owner, uint64_t id) const {
  return strCat(prefix_, "-g", owner, "-", id);
}

// The owner is party 0; the other ranks of the host follow in rank order.
int RegisteredMemory::partyOf(int rank, int owner) const {
  const int me = static_cast<int>(std::find(host_ranks_.begin(), host_ranks_.end(), rank) - host_ranks_.begin());
  const int own = static_cast<int>(std::find(host_ranks_.begin(), host_ranks_.end(), owner) - host_ranks_.begin());
  return me < own ? me + 1 : me;
}

std::shared_ptr<void> RegisteredMemory::allocate(size_t bytes) {
  if (bytes == 0) throw InvalidArgument(strCat("rank ", rank_, ": a registered buffer needs at least one byte"));
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(registry_->mu);
    id = next_id_++;
  }
  auto seg = std::make_shared<ShmSegment>(
      ShmSegment::create(segmentName(rank_, id), bytes, static_cast<int>(host_ranks_.size()), rank_));
  char* base = static_cast<char*>(seg->data());
  {
    std::lock_guard<std::mutex> lock(registry_->mu);
    registry_->own[base] = Own{bytes, id};
  }
  std::weak_ptr<Registry> weak = registry_;
  // The deleter forgets the buffer (if the registry still exists) before the
  // segment is unmapped, so find() never reports freed memory.
  return std::shared_ptr<void>(base, [seg, weak](void* p) {
    if (auto reg = weak.lock()) {
      std::lock_guard<std::mutex> lock(reg->mu);
      reg->own.erase(static_cast<const char*>(p));
    }
  });
}

bool RegisteredMemory::find(const void* data, size_t bytes, RegisteredRef* where) const {
  const char* p = static_cast<const char*>(data);
  std::lock_guard<std::mutex> lock(registry_->mu);
  auto it = registry_->own.upper_bound(p);
  if (it == registry_->own.begin()) return false;
  --it;
  const size_t offset = static_cast<size_t>(p - it->first);
  if (offset + bytes > it->second.bytes) return false;
  *where = RegisteredRef{it->second.id, rank_, offset, it->second.bytes};
  return true;
}

char* RegisteredMemory::peerBuffer(const RegisteredRef& ref, Deadline deadline) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  // Drop mappings of buffers their owners have released: their memory would
  // otherwise live on as long as this rank.
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (it->second.peer(0) == ShmSegment::Peer::kAlive) {
      ++it;
    } else {
      it = peers_.erase(it);
    }
  }
  const auto key = std::make_pair(ref.owner, ref.id);
  auto it = peers_.find(key);
  if (it == peers_.end()) {
    if (std::find(host_ranks_.begin(), host_ranks_.end(), ref.owner) == host_ranks_.end() || ref.owner == rank_)
      throw CollectiveError(strCat("rank ", rank_, ": registered buffer ", ref.id, " of rank ", ref.owner,
                                   " is not a peer's on this host"));
    ShmSegment seg = ShmSegment::open(segmentName(ref.owner, ref.id), ref.bytes, static_cast<int>(host_ranks_.size()),
                                      partyOf(rank_, ref.owner), rank_, ref.owner, deadline);
    it = peers_.emplace(key, std::move(seg)).first;
  }
  return static_cast<char*>(it->second.data());
}

size_t RegisteredMemory::ownBuffers() const {
  std::lock_guard<std::mutex> lock(registry_->mu);
  return registry_->own.size();
}

size_t RegisteredMemory::peerMappings() const {
  std::lock_guard<std::mutex> lock(peers_mu_);
  return peers_.size();
}

}  // namespace hvdtorch
