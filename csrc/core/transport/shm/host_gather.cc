#include "transport/shm/host_gather.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "transport/shm/wait.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL, and the write faults the pages in
#endif

namespace hvdtorch {

namespace {

size_t roundUp64(size_t n) { return (n + 63) / 64 * 64; }

// The control segment's user region: one signal, then one record per bucket.
struct Control {
  ShmSignal signal;
};

}  // namespace

// Bucket j's counters in the control segment (all zero initially):
// cleared (the last gather whose pages were handed back), releases (total
// releases of all gathers: the release that makes it parties x n is the
// last of gather n, and clears), then put[party] and released[party] (the
// last gather each local rank put / released).
struct HostGather::Record {
  std::atomic<uint64_t>* cleared;
  std::atomic<uint64_t>* releases;
  std::atomic<uint64_t>* put;
  std::atomic<uint64_t>* released;
};

HostGather::HostGather(std::string name, int party, std::vector<int> party_ranks, std::vector<size_t> bucket_bytes,
                       std::chrono::milliseconds timeout)
    : name_(std::move(name)),
      party_(party),
      party_ranks_(std::move(party_ranks)),
      bucket_bytes_(std::move(bucket_bytes)),
      timeout_(timeout),
      data_(bucket_bytes_.size()),
      local_(bucket_bytes_.size()) {
  const int n = parties();
  if (n < 1 || party < 0 || party >= n)
    throw InvalidArgument(strCat("host gather ", name_, ": bad party ", party, " of ", n));
  for (size_t j = 0; j < bucket_bytes_.size(); ++j)
    if (bucket_bytes_[j] == 0) throw InvalidArgument(strCat("host gather ", name_, ": bucket ", j, " has no bytes"));
  record_stride_ = roundUp64((2 + 2 * static_cast<size_t>(n)) * sizeof(std::atomic<uint64_t>));
  const size_t bytes = roundUp64(sizeof(Control)) + record_stride_ * std::max<size_t>(bucket_bytes_.size(), 1);
  const int self = party_ranks_[party];
  const std::string control = name_ + "-c";
  control_ = party == 0 ? ShmSegment::create(control, bytes, n, self)
                        : ShmSegment::open(control, bytes, n, party, self, party_ranks_[0], Deadline::after(timeout_));
}

HostGather::~HostGather() = default;

HostGather::Record HostGather::record(int j) const {
  auto* base = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(control_.data()) +
                                                        roundUp64(sizeof(Control)) + record_stride_ * j);
  return {base, base + 1, base + 2, base + 2 + parties()};
}

void HostGather::check(int j, Stage expected, const char* call) const {
  if (j < 0 || static_cast<size_t>(j) >= local_.size())
    throw InvalidArgument(strCat("host gather ", name_, ": ", call, " of bucket ", j, " of ", local_.size()));
  if (local_[j].stage != expected)
    throw InvalidArgument(strCat("host gather ", name_, ": ", call, " of bucket ", j, " out of order (put, await, ",
                                 "release for each gather)"));
}

void HostGather::mapBucket(int j) {
  const std::string name = strCat(name_, "-b", j);
  const int self = party_ranks_[party_];
  data_[j] = std::make_shared<ShmSegment>(party_ == 0
                                              ? ShmSegment::create(name, bucket_bytes_[j], parties(), self)
                                              : ShmSegment::open(name, bucket_bytes_[j], parties(), party_, self,
                                                                 party_ranks_[0], Deadline::after(timeout_)));
}

template <typename Ready, typename Missing>
void HostGather::wait(Ready&& ready, Missing&& missing, const std::string& what) {
  const int self = party_ranks_[party_];
  const auto gone = [&]() -> ShmGone {
    for (int p = 0; p < parties(); ++p) {
      if (p == party_) continue;
      switch (control_.peer(p)) {
        case ShmSegment::Peer::kDead:
          return strCat("rank ", self, ": local rank ", party_ranks_[p], " (pid ", control_.pidOf(p), ") died; ", what,
                        " cannot complete");
        case ShmSegment::Peer::kDetached:
          return {strCat("rank ", self, ": local rank ", party_ranks_[p], " left; ", what, " cannot complete"), true};
        default: break;
      }
    }
    return {};
  };
  auto* control = static_cast<Control*>(control_.data());
  shmWait(control->signal, Deadline::after(timeout_), ready, gone, [&](std::chrono::milliseconds waited) {
    return strCat("rank ", self, ": timed out after ", waited.count(), " ms in ", what, "; still waiting for ",
                  missing(), " (every rank must gather the same buckets in the same order)");
  });
}

bool HostGather::put(int j, const void* src, size_t offset, size_t bytes, bool wait_for_release) {
  if (j >= 0 && static_cast<size_t>(j) < local_.size() && local_[j].stage == Stage::kIdle) {
    local_[j].stage = Stage::kBegun;
    ++local_[j].gen;
  }
  check(j, Stage::kBegun, "put");
  if (offset + bytes > bucket_bytes_[j] || (bytes > 0 && src == nullptr))
    throw InvalidArgument(strCat("host gather ", name_, ": put of bytes [", offset, ", ", offset + bytes,
                                 ") of bucket ", j, " of ", bucket_bytes_[j], " bytes"));
  const uint64_t gen = local_[j].gen;
  const Record r = record(j);
  const auto released = [&] { return r.cleared->load(std::memory_order_acquire) >= gen - 1; };
  if (!released()) {
    if (!wait_for_release) return false;
    wait(
        released,
        [&] {
          std::string out;
          for (int p = 0; p < parties(); ++p)
            if (r.released[p].load(std::memory_order_acquire) < gen - 1)
              out += strCat(out.empty() ? "" : ", ", "rank ", party_ranks_[p]);
          return strCat(out.empty() ? "the last releaser" : out, " to release gather ", gen - 1);
        },
        strCat("the release of bucket ", j, " (host gather ", name_, ")"));
  }
  if (!data_[j]) mapBucket(j);
  char* base = static_cast<char*>(data_[j]->data());  // page-aligned (ShmSegment)
  if (bytes > 0 && gen > 1) {
    // The pages were handed back at the last clear: commit them again, so
    // that a full /dev/shm is an error here rather than a SIGBUS in the copy.
    const size_t page = 4096;
    const size_t lo = offset / page * page;
    const size_t hi = std::min(data_[j]->bytes(), (offset + bytes + page - 1) / page * page);
    if (madvise(base + lo, hi - lo, MADV_POPULATE_WRITE) != 0 && errno != EINVAL)
      throw CollectiveError(strCat("rank ", party_ranks_[party_], ": /dev/shm cannot hold bucket ", j,
                                   " of host gather ", name_, " (", bucket_bytes_[j], " bytes): ", strerror(errno)));
  }
  char* dst = base + offset;
  if (bytes > 0) std::memcpy(dst, src, bytes);
  // seq_cst: pairs with the waiters' loads as in ShmArena's barrier (one of
  // two last arrivals sees the other and wakes the sleepers).
  r.put[party_].store(gen, std::memory_order_seq_cst);
  static_cast<Control*>(control_.data())->signal.notify();
  local_[j].stage = Stage::kPut;
  return true;
}

std::shared_ptr<char> HostGather::await(int j) {
  check(j, Stage::kPut, "await");
  const uint64_t gen = local_[j].gen;
  const Record r = record(j);
  const auto all_put = [&] {
    for (int p = 0; p < parties(); ++p)
      if (r.put[p].load(std::memory_order_acquire) < gen) return false;
    return true;
  };
  wait(
      all_put,
      [&] {
        std::string out;
        for (int p = 0; p < parties(); ++p)
          if (r.put[p].load(std::memory_order_acquire) < gen)
            out += strCat(out.empty() ? "" : ", ", "rank ", party_ranks_[p]);
        return strCat(out, " to put their shards of gather ", gen);
      },
      strCat("the gather of bucket ", j, " (host gather ", name_, ")"));
  local_[j].stage = Stage::kHeld;
  std::shared_ptr<ShmSegment> seg = data_[j];
  return std::shared_ptr<char>(seg, static_cast<char*>(seg->data()));
}

void HostGather::release(int j) {
  check(j, Stage::kHeld, "release");
  const uint64_t gen = local_[j].gen;
  const Record r = record(j);
  r.released[party_].store(gen, std::memory_order_release);
  // Exactly one release of this gather sees the count reach parties x gen.
  if (r.releases->fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint64_t>(parties()) * gen) {
    // Hand the pages back; the mapping stays (a late reader sees zeros, never a fault).
    madvise(data_[j]->data(), bucket_bytes_[j], MADV_REMOVE);
    r.cleared->store(gen, std::memory_order_seq_cst);
    static_cast<Control*>(control_.data())->signal.notify();
  }
  local_[j].stage = Stage::kIdle;
}

}  // namespace hvdtorch
