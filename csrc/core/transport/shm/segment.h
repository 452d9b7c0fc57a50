// A POSIX shared-memory segment mapped by a fixed set of parties on one host
// (the two ends of a ShmLink, the local ranks of a node arena).
//
// Lifetime and cleanup (the point of this class):
//  * The creator (party 0) makes the name with O_CREAT|O_EXCL and mode 0600,
//    sizes it with posix_fallocate (so a full /dev/shm is an error now, not a
//    SIGBUS later), initialises the header and publishes it last (`magic`,
//    release).
//  * The other parties open it, retrying until their deadline (TimeoutError
//    naming the rank and the segment), and each registers in the header: its
//    party slot (pid, start time) and the `attached` count.
//  * The party whose registration completes the count unlinks the name at
//    once. From then on nothing is left in /dev/shm whatever happens: the
//    kernel frees the memory when the last mapping goes, kill -9 included.
//  * Until then, any party that goes away (destructor) unlinks the name
//    itself, so a peer that never arrived leaves nothing behind either.
//  * A process that exits or is terminated while it still owns names it
//    created (a segment object it never destroyed: memory held at exit, an
//    exception, SIGTERM from a launcher) removes them on the way out: every
//    name a process creates is recorded until it is unlinked, and exit()
//    (an atexit handler) and a SIGTERM whose disposition was the default
//    (a handler installed at the first create(), which then re-raises the
//    signal) unlink what is recorded. Only the creating process does this,
//    never a child it forked.
//  * What SIGKILL leaves (a creator killed before every party attached) is
//    removed by removeDeadJobSegments(): segments whose creator is dead,
//    created in this pid namespace. hvdtorch.init() calls it on every rank
//    (the next job on the host cleans up), and so does the exit handler
//    (surviving peers clean up); the next create() of the same name does too.
//
// The user region is zero-filled and page-aligned. The structures callers
// place there are designed so that all-zero bytes is their initial state:
// no constructor runs in shared memory after the segment is published.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/deadline.h"

namespace hvdtorch {

// Builds a segment name prefix from a job token (launcher run id, store key,
// ...): "/hvdtorch-<token>", with characters outside [A-Za-z0-9._-] replaced
// and long tokens shortened with a hash, so the result plus the suffixes the
// transports append stays a valid, short shm_open name.
std::string makeShmPrefix(const std::string& job_token);

class ShmSegment {
 public:
  // How this party sees another one.
  enum class Peer {
    kAbsent,    // has not attached (yet)
    kAlive,     // attached and its process exists
    kDetached,  // attached, then released its mapping (its object was destroyed)
    kDead,      // attached, and its process is gone (killed, crashed, exited)
  };

  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Creates `name` for `parties` parties (the creator is party 0) with
  // `bytes` user bytes. `self_rank` only appears in messages. Throws
  // InvalidArgument for a bad name, CollectiveError when the name is taken by
  // a live segment or /dev/shm is full.
  static ShmSegment create(const std::string& name, size_t bytes, int parties, int self_rank);

  // Maps `name` as party `party` (1 .. parties-1), waiting until rank
  // `creator_rank` has created it. Checks that it was made for `parties`
  // parties and `bytes` user bytes (ranks disagreeing on a size is an error,
  // not silent corruption).
  static ShmSegment open(const std::string& name, size_t bytes, int parties, int party, int self_rank, int creator_rank,
                         Deadline deadline);

  bool valid() const { return base_ != nullptr; }
  void* data() const { return user_; }
  size_t bytes() const { return user_bytes_; }
  const std::string& name() const { return name_; }
  int party() const { return party_; }
  int parties() const { return parties_; }

  Peer peer(int party) const;
  int32_t pidOf(int party) const;  // 0 while absent
  bool allAttached() const;

  // Marks this party as gone so that waiting peers fail fast (kDetached)
  // instead of running into their deadline. Idempotent; the destructor calls it.
  void detach();
  // Removes the name now; the mapping stays valid. Idempotent.
  void unlink();

  // Removes every segment whose name starts with `prefix` and whose creator
  // has died (what a killed creator leaves when not every party attached).
  // Returns how many it removed.
  static int removeStale(const std::string& prefix);
  // removeStale() over the segments of every hvdtorch job ("/hvdtorch-"
  // names, makeShmPrefix). Segments made in another pid namespace (a
  // container sharing /dev/shm) are left alone: their creators cannot be seen.
  static int removeDeadJobSegments();

  // Checks that `name` is a valid shm_open name: one leading '/', no other
  // '/', at most 255 characters. Throws InvalidArgument otherwise.
  static void checkName(const std::string& name);

 private:
  struct Header;
  struct PartySlot;
  Header* header() const { return reinterpret_cast<Header*>(base_); }
  PartySlot* slot(int party) const;
  void registerSelf(int self_rank);
  void release();
  static bool removeIfStale(const std::string& name, std::string* why_not);

  std::string name_;
  void* base_ = nullptr;
  size_t total_bytes_ = 0;
  void* user_ = nullptr;
  size_t user_bytes_ = 0;
  int party_ = -1;
  int parties_ = 0;
  bool detached_ = false;
  int record_ = -1;  // this process's record of the name while it is ours to unlink
};

}  // namespace hvdtorch
