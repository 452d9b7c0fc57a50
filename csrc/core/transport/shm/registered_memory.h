// Registered buffers: memory a rank allocates once, inside shared memory,
// for buffers that live for the whole job (DistributedModel's buckets, a
// sharded optimizer's, the engine's fusion buffer), so that the node
// reducer of its host can read the buffer in place and write reduced slices
// straight into it -- no copy into the node arena, no copy out ("register
// once", as Gloo+ and PFN's study argue for).
//
// Each buffer is a ShmSegment of its own, named
// "<prefix>-g<owner rank>-<id>", created by its owner with one party per rank
// of the host (the job's local ranks, in rank order; the owner is party 0).
// A peer maps it the first time the node reducer meets it (peerBuffer) and
// keeps the mapping until the owner releases the buffer. ShmSegment's rules
// apply: the name is gone once every local rank has mapped it; before that,
// the owner's destructor removes it, and if the owner is killed first, the
// destructor of any other rank's RegisteredMemory on the host does.
//
// Contract:
//  * allocate() may be called from any thread; the returned memory is
//    zero-filled, page-aligned and stays valid while the shared_ptr (or a
//    copy) lives, even after this RegisteredMemory is destroyed.
//  * find() says whether a byte range lies inside one live buffer of this
//    rank, and where (the node reducer publishes that to its peers).
//  * peerBuffer() maps a peer's buffer (cached; thread-safe). Mappings of
//    buffers their owner has released are dropped at the next call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "transport/shm/segment.h"

namespace hvdtorch {

// Where a byte range lives: buffer `id` of rank `owner`, `offset` bytes in;
// the buffer has `bytes` bytes. `id` 0 means "not registered".
struct RegisteredRef {
  uint64_t id = 0;
  int32_t owner = -1;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

class RegisteredMemory {
 public:
  // `prefix`: job-unique segment prefix (makeShmPrefix). `rank`: this global
  // rank. `host_ranks`: the global ranks of this host in rank order
  // (Topology::local_ranks of the job), this rank among them.
  RegisteredMemory(std::string prefix, int rank, std::vector<int> host_ranks);
  ~RegisteredMemory();
  RegisteredMemory(const RegisteredMemory&) = delete;
  RegisteredMemory& operator=(const RegisteredMemory&) = delete;

  // A zero-filled buffer of `bytes` (> 0) bytes. Throws CollectiveError when
  // /dev/shm cannot hold it.
  std::shared_ptr<void> allocate(size_t bytes);

  // Whether [data, data + bytes) lies in one live buffer of this rank.
  bool find(const void* data, size_t bytes, RegisteredRef* where) const;

  // Base address of peer buffer `ref` (ref.owner on this host), mapped on
  // first use. Throws CollectiveError if it cannot be mapped by `deadline`.
  char* peerBuffer(const RegisteredRef& ref, Deadline deadline);

  int rank() const { return rank_; }
  // Live buffers of this rank and mapped peer buffers (for tests).
  size_t ownBuffers() const;
  size_t peerMappings() const;

 private:
  struct Own {
    size_t bytes;
    uint64_t id;
  };
  // Shared with the buffers' deleters, which may outlive this object.
  struct Registry {
    std::mutex mu;
    std::map<const char*, Own> own;  // by base address
  };
  std::string segmentName(int owner, uint64_t id) const;
  int partyOf(int rank, int owner) const;

  std::string prefix_;
  int rank_;
  std::vector<int> host_ranks_;
  std::shared_ptr<Registry> registry_;
  uint64_t next_id_ = 1;  // guarded by registry_->mu

  mutable std::mutex peers_mu_;
  std::map<std::pair<int32_t, uint64_t>, ShmSegment> peers_;  // (owner, id) -> mapping
};

}  // namespace hvdtorch
