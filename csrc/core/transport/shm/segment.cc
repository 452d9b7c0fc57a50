#include "transport/shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"
#include "transport/shm/process.h"

namespace hvdtorch {

namespace {

// Children forked by a rank (data-loader workers) must not inherit the
// mapping: they never use it, and holding it would keep the memory alive
// after the rank itself is gone.
void dontFork(void* base, size_t bytes) {
#ifdef MADV_DONTFORK
  madvise(base, bytes, MADV_DONTFORK);
#else
  (void)base;
  (void)bytes;
#endif
}

constexpr uint64_t kMagic = 0x3130'4d48'5344'5648ull;  // "HVDSHM01"
constexpr size_t kPage = 4096;

enum PartyState : uint32_t { kAbsent = 0, kClaiming = 1, kAttached = 2, kDetached = 3 };

size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

std::string errnoText(int err) { return std::strerror(err); }

constexpr char kJobPrefix[] = "/hvdtorch-";  // makeShmPrefix's names

// The pid namespace of this process (0 if unknown): pids recorded in a
// segment only mean something to processes of the same namespace.
uint64_t pidNamespace() {
  static const uint64_t ns = [] {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : uint64_t(0);
  }();
  return ns;
}

// The names this process created and may still have to unlink, in a fixed
// table that a signal handler can walk without locks or allocation. A
// record holds the creator's pid (0: free, -1: being written), so a forked
// child never removes its parent's names.
constexpr int kNameRecords = 1024;
constexpr size_t kPathBytes = 8 + 256 + 1;  // "/dev/shm" + a name of at most 255 characters
struct NameRecord {
  std::atomic<int32_t> owner;
  char path[kPathBytes];
};
NameRecord g_names[kNameRecords];  // static storage: zero-filled, never destroyed

// Async-signal-safe: getpid, atomics, unlink.
void unlinkRecordedNames() {
  const int32_t me = static_cast<int32_t>(getpid());
  for (NameRecord& r : g_names)
    if (r.owner.load(std::memory_order_acquire) == me) ::unlink(r.path);
}

void unlinkOnTerminate(int sig) {
  unlinkRecordedNames();
  raise(sig);  // the disposition is the default again (SA_RESETHAND): terminates once this returns
}

void cleanUpAtExit() {
  unlinkRecordedNames();
  ShmSegment::removeDeadJobSegments();
}

void installExitCleanup() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::atexit(cleanUpAtExit);
    // Only where SIGTERM would terminate anyway: a handler the program set
    // itself decides what SIGTERM means, and is left alone.
    struct sigaction old;
    if (sigaction(SIGTERM, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) return;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = unlinkOnTerminate;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGTERM, &sa, nullptr);
  });
}

// Records `name` as this process's to unlink; -1 when the table is full
// (the name then relies on the other rules alone).
int recordName(const std::string& name) {
  installExitCleanup();
  for (int i = 0; i < kNameRecords; ++i) {
    int32_t expected = 0;
    if (g_names[i].owner.compare_exchange_strong(expected, -1, std::memory_order_acq_rel)) {
      std::snprintf(g_names[i].path, kPathBytes, "/dev/shm%s", name.c_str());
      g_names[i].owner.store(static_cast<int32_t>(getpid()), std::memory_order_release);
      return i;
    }
  }
  return -1;
}

void forgetName(int record) {
  if (record >= 0) g_names[record].owner.store(0, std::memory_order_release);
}

}  // namespace

// Lives at offset 0 of every segment; all-zero until the creator publishes
// `magic`. Plain fields are written once, before `magic` (release), and read
// only after `magic` (acquire) has been seen.
struct ShmSegment::Header {
  std::atomic<uint64_t> magic;
  uint64_t total_bytes;
  uint64_t user_offset;
  uint64_t user_bytes;
  uint32_t parties;
  std::atomic<uint32_t> attached;  // parties registered so far, creator included
  std::atomic<uint32_t> unlinked;  // 1 once the name has been removed
  uint64_t pid_ns;                 // the creator's pid namespace (0: unknown)
};

// One per party, after the header. `state` publishes the other fields.
struct alignas(64) ShmSegment::PartySlot {
  std::atomic<uint32_t> state;  // PartyState
  int32_t rank;
  int32_t pid;
  uint64_t start_time;
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory atomics must be lock-free");

std::string makeShmPrefix(const std::string& job_token) {
  std::string clean;
  for (char c : job_token) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    clean.push_back(ok ? c : '_');
  }
  constexpr size_t kMaxToken = 64;  // leaves ample room for the transports' suffixes
  if (clean.size() > kMaxToken) {
    const size_t h = std::hash<std::string>{}(job_token);
    clean = clean.substr(0, kMaxToken - 17) + "-" + strCat(std::hex, h);
  }
  return "/hvdtorch-" + clean;
}

int ShmSegment::removeDeadJobSegments() { return removeStale(kJobPrefix); }

int ShmSegment::removeStale(const std::string& prefix) {
  std::vector<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      const std::string name = std::string("/") + e->d_name;
      if (name.compare(0, prefix.size(), prefix) == 0) names.push_back(name);
    }
    closedir(d);
  }
  int removed = 0;
  for (const std::string& name : names) {
    std::string why_not;
    if (removeIfStale(name, &why_not)) ++removed;
  }
  return removed;
}

void ShmSegment::checkName(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos || name.size() > 255)
    throw InvalidArgument(strCat("invalid shared-memory segment name '", name,
                                 "': needs one leading '/', no other '/', at most 255 characters"));
}

ShmSegment::PartySlot* ShmSegment::slot(int party) const {
  return reinterpret_cast<PartySlot*>(static_cast<char*>(base_) + roundUp(sizeof(Header), 64)) + party;
}

// If an existing segment `name` was made by a process that is now dead, it is
// a leftover of a crashed job: remove it and report true. Otherwise say why
// it must stay.
bool ShmSegment::removeIfStale(const std::string& name, std::string* why_not) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) {
    const int err = errno;
    *why_not = strCat("it exists but cannot be inspected (", errnoText(err), ")");
    return err == ENOENT;  // vanished meanwhile: try again
  }
  struct stat st;
  void* p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= kPage)
    p = mmap(nullptr, kPage, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  *why_not = strCat("it exists but was never initialised (left by a crashed process? remove /dev/shm", name, ")");
  if (p == MAP_FAILED) return false;
  ShmSegment probe;  // a read-only view of the header; never registered
  probe.base_ = p;
  probe.total_bytes_ = kPage;
  bool stale = false;
  const Header* h = probe.header();
  if (h->magic.load(std::memory_order_acquire) == kMagic && h->pid_ns != 0 && h->pid_ns != pidNamespace()) {
    *why_not = "its creator is in another pid namespace (a container sharing /dev/shm?)";
  } else if (h->magic.load(std::memory_order_acquire) == kMagic) {
    ProcessId creator;
    creator.pid = probe.slot(0)->pid;
    creator.start_time = probe.slot(0)->start_time;
    stale = !creator.alive();
    if (!stale) *why_not = strCat("its creator (pid ", creator.pid, ") is alive: do two jobs share the prefix?");
  }
  munmap(p, kPage);
  probe.base_ = nullptr;
  if (stale) shm_unlink(name.c_str());
  return stale;
}

ShmSegment ShmSegment::create(const std::string& name, size_t bytes, int parties, int self_rank) {
  checkName(name);
  if (parties < 1) throw InvalidArgument(strCat("segment ", name, ": needs at least one party"));
  ShmSegment seg;
  seg.name_ = name;
  seg.party_ = 0;
  seg.parties_ = parties;
  const size_t user_offset = roundUp(roundUp(sizeof(Header), 64) + parties * sizeof(PartySlot), kPage);
  seg.total_bytes_ = user_offset + roundUp(bytes, 64);

  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) {
      seg.record_ = recordName(name);
      break;
    }
    const int err = errno;
    std::string why_not;
    if (err != EEXIST || attempt > 0 || !removeIfStale(name, &why_not)) {
      throw CollectiveError(strCat("rank ", self_rank, ": cannot create shared-memory segment ", name, ": ",
                                   err == EEXIST && !why_not.empty() ? why_not : errnoText(err)));
    }
  }
  // posix_fallocate reserves the pages now: on a full /dev/shm (small
  // container default) this fails cleanly instead of SIGBUS on first touch.
  int rc = posix_fallocate(fd, 0, static_cast<off_t>(seg.total_bytes_));
  if (rc == EOPNOTSUPP || rc == EINVAL) rc = ftruncate(fd, static_cast<off_t>(seg.total_bytes_)) == 0 ? 0 : errno;
  if (rc != 0) {
    close(fd);
    shm_unlink(name.c_str());
    throw CollectiveError(strCat("rank ", self_rank, ": cannot size shared-memory segment ", name, " to ",
                                 seg.total_bytes_, " bytes: ", errnoText(rc),
                                 rc == ENOSPC ? " (/dev/shm is full: enlarge it, e.g. docker --shm-size, "
                                                "or set HVDTORCH_SHM=0)"
                                              : ""));
  }
  void* base = mmap(nullptr, seg.total_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_err = errno;
  close(fd);  // the mapping keeps the memory
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    throw CollectiveError(
        strCat("rank ", self_rank, ": cannot map shared-memory segment ", name, ": ", errnoText(map_err)));
  }
  dontFork(base, seg.total_bytes_);
  seg.base_ = base;
  seg.user_ = static_cast<char*>(base) + user_offset;
  seg.user_bytes_ = bytes;

  Header* h = seg.header();
  h->total_bytes = seg.total_bytes_;
  h->user_offset = user_offset;
  h->user_bytes = bytes;
  h->parties = static_cast<uint32_t>(parties);
  h->pid_ns = pidNamespace();
  PartySlot* me = seg.slot(0);
  const ProcessId id = ProcessId::self();
  me->rank = self_rank;
  me->pid = id.pid;
  me->start_time = id.start_time;
  me->state.store(kAttached, std::memory_order_relaxed);
  h->attached.store(1, std::memory_order_relaxed);
  h->magic.store(kMagic, std::memory_order_release);  // publishes everything above
  if (parties == 1) seg.unlink();
  return seg;
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes, int parties, int party, int self_rank,
                            int creator_rank, Deadline deadline) {
  checkName(name);
  if (party < 1 || party >= parties)
    throw InvalidArgument(strCat("segment ", name, ": party ", party, " out of range 1..", parties - 1));
  auto timeout = [&](const char* what) {
    return TimeoutError(strCat("rank ", self_rank, ": timed out waiting for rank ", creator_rank, " to ", what,
                               " shared-memory segment ", name));
  };
  auto pause = [&](int attempt) {
    // Back off from 50 us to 5 ms: a peer usually appears within
    // milliseconds, and polling faster only steals its core.
    const auto d = std::chrono::microseconds(std::min(5000, 50 << std::min(attempt, 7)));
    std::this_thread::sleep_for(std::min<std::chrono::microseconds>(d, deadline.remaining()));
  };

  ShmSegment seg;
  seg.name_ = name;
  seg.parties_ = parties;  // party_ stays -1 until the slot is ours

  // 1. Wait for the name to exist with its final size.
  struct stat st;
  int fd = -1;
  for (int attempt = 0;; ++attempt) {
    fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd >= 0) {
      if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= kPage) break;
      close(fd);  // created but not yet sized
      fd = -1;
    } else if (const int err = errno; err != ENOENT) {
      throw CollectiveError(strCat("rank ", self_rank, ": cannot open shared-memory segment ", name, " of rank ",
                                   creator_rank, ": ", errnoText(err)));
    }
    if (deadline.expired()) throw timeout("create");
    pause(attempt);
  }
  void* base = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_err = errno;
  close(fd);
  if (base == MAP_FAILED)
    throw CollectiveError(
        strCat("rank ", self_rank, ": cannot map shared-memory segment ", name, ": ", errnoText(map_err)));
  dontFork(base, static_cast<size_t>(st.st_size));
  seg.base_ = base;
  seg.total_bytes_ = static_cast<size_t>(st.st_size);

  // 2. Wait for the creator to publish the header.
  Header* h = seg.header();
  for (int attempt = 0; h->magic.load(std::memory_order_acquire) != kMagic; ++attempt) {
    if (deadline.expired()) throw timeout("initialise");
    pause(attempt);
  }
  if (h->total_bytes != seg.total_bytes_ || h->parties != static_cast<uint32_t>(parties) || h->user_bytes != bytes) {
    throw CollectiveError(strCat("rank ", self_rank, ": shared-memory segment ", name, " of rank ", creator_rank,
                                 " was made for ", h->parties, " parties and ", h->user_bytes, " bytes; expected ",
                                 parties, " and ", bytes, " (do ranks disagree on the shared-memory settings?)"));
  }
  seg.user_ = static_cast<char*>(base) + h->user_offset;
  seg.user_bytes_ = bytes;

  // 3. A creator that is already gone will never talk to us.
  switch (seg.peer(0)) {
    case Peer::kDead:
      seg.unlink();  // a leftover: nobody else would remove it
      throw CollectiveError(strCat("rank ", self_rank, ": rank ", creator_rank, " (pid ", seg.pidOf(0),
                                   ") died after creating shared-memory segment ", name));
    case Peer::kDetached:
      throw CollectiveError(strCat("rank ", self_rank, ": rank ", creator_rank, " released shared-memory segment ",
                                   name, " before rank ", self_rank, " attached"));
    default: break;
  }

  // 4. Register; the registration that completes the count removes the name.
  uint32_t expected = kAbsent;
  if (!seg.slot(party)->state.compare_exchange_strong(expected, kClaiming, std::memory_order_acq_rel)) {
    throw CollectiveError(strCat("rank ", self_rank, ": party ", party, " of shared-memory segment ", name,
                                 " is already taken (by rank ", seg.slot(party)->rank, ")"));
  }
  seg.party_ = party;
  seg.registerSelf(self_rank);
  return seg;
}

void ShmSegment::registerSelf(int self_rank) {
  PartySlot* me = slot(party_);
  const ProcessId id = ProcessId::self();
  me->rank = self_rank;
  me->pid = id.pid;
  me->start_time = id.start_time;
  me->state.store(kAttached, std::memory_order_release);
  const uint32_t now = header()->attached.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (now == static_cast<uint32_t>(parties_)) unlink();
}

ShmSegment::Peer ShmSegment::peer(int party) const {
  const PartySlot* s = slot(party);
  switch (s->state.load(std::memory_order_acquire)) {
    case kAttached: {
      ProcessId id;
      id.pid = s->pid;
      id.start_time = s->start_time;
      return id.alive() ? Peer::kAlive : Peer::kDead;
    }
    case kDetached: return Peer::kDetached;
    default: return Peer::kAbsent;
  }
}

int32_t ShmSegment::pidOf(int party) const {
  const PartySlot* s = slot(party);
  const uint32_t st = s->state.load(std::memory_order_acquire);
  return (st == kAttached || st == kDetached) ? s->pid : 0;
}

bool ShmSegment::allAttached() const {
  return header()->attached.load(std::memory_order_acquire) == static_cast<uint32_t>(parties_);
}

void ShmSegment::detach() {
  if (!base_ || detached_ || party_ < 0) return;
  detached_ = true;
  slot(party_)->state.store(kDetached, std::memory_order_release);
}

void ShmSegment::unlink() {
  if (!base_) return;
  if (header()->unlinked.exchange(1, std::memory_order_acq_rel) == 0) shm_unlink(name_.c_str());
  forgetName(std::exchange(record_, -1));
}

void ShmSegment::release() {
  if (!base_) {
    forgetName(std::exchange(record_, -1));  // a create() that failed has unlinked the name itself
    return;
  }
  detach();
  // A party leaving before everyone attached takes the name with it: the
  // segment can no longer serve its purpose, and nobody may be left to
  // remove it otherwise.
  unlink();
  munmap(base_, total_bytes_);
  base_ = nullptr;
  user_ = nullptr;
}

ShmSegment::~ShmSegment() { release(); }

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    base_ = std::exchange(other.base_, nullptr);
    total_bytes_ = other.total_bytes_;
    user_ = std::exchange(other.user_, nullptr);
    user_bytes_ = other.user_bytes_;
    party_ = other.party_;
    parties_ = other.parties_;
    detached_ = other.detached_;
    record_ = std::exchange(other.record_, -1);
  }
  return *this;
}

}  // namespace hvdtorch
