#include "transport/shm/arena.h"

#include <atomic>
#include <type_traits>

#include "common/error.h"
#include "transport/shm/wait.h"

namespace hvdtorch {

namespace {

size_t roundUp64(size_t n) { return (n + 63) / 64 * 64; }

struct alignas(64) ArrivalCounter {
  std::atomic<uint64_t> n;
};

struct alignas(64) SourceRecord {
  RegisteredRef ref;
};
static_assert(std::is_trivially_copyable<RegisteredRef>::value, "source records live in shared memory");

}  // namespace

// Start of the user region; all-zero is the initial state. The per-rank
// arrival counters follow it, then the per-rank source records, then the
// slots.
struct ShmArena::Control {
  ShmSignal barrier;
};

ShmArena::ShmArena(const std::string& name, int local_rank, const std::vector<int>& local_ranks, size_t slot_bytes,
                   Deadline deadline)
    : local_rank_(local_rank), local_ranks_(local_ranks) {
  const int size = static_cast<int>(local_ranks.size());
  if (size < 1 || local_rank < 0 || local_rank >= size || slot_bytes == 0)
    throw InvalidArgument(
        strCat("node arena ", name, ": bad local rank ", local_rank, " of ", size, " or slot size ", slot_bytes));
  slot_stride_ = roundUp64(slot_bytes);
  sources_offset_ = roundUp64(sizeof(Control) + size * sizeof(ArrivalCounter));
  slots_offset_ = sources_offset_ + size * sizeof(SourceRecord);
  const size_t bytes = slots_offset_ + 2 * static_cast<size_t>(size) * slot_stride_;
  const int self = local_ranks[local_rank];
  seg_ = local_rank == 0 ? ShmSegment::create(name, bytes, size, self)
                         : ShmSegment::open(name, bytes, size, local_rank, self, local_ranks[0], deadline);
}

ShmArena::Control* ShmArena::control() const { return static_cast<Control*>(seg_.data()); }

std::atomic<uint64_t>& ShmArena::arrivals(int j) const {
  auto* counters = reinterpret_cast<ArrivalCounter*>(static_cast<char*>(seg_.data()) + sizeof(Control));
  return counters[j].n;
}

RegisteredRef& ShmArena::source(int owner) const {
  auto* records = reinterpret_cast<SourceRecord*>(static_cast<char*>(seg_.data()) + sources_offset_);
  return records[owner].ref;
}

char* ShmArena::slot(int set, int owner) const {
  return static_cast<char*>(seg_.data()) + slots_offset_ + (set * localSize() + owner) * slot_stride_;
}

bool ShmArena::allArrived(uint64_t n) const {
  for (int j = 0; j < localSize(); ++j)
    if (arrivals(j).load(std::memory_order_acquire) < n) return false;
  return true;
}

std::string ShmArena::missing(uint64_t n) const {
  std::string out;
  for (int j = 0; j < localSize(); ++j) {
    if (arrivals(j).load(std::memory_order_acquire) >= n) continue;
    out += strCat(out.empty() ? "" : ", ", "local rank ", j, " (rank ", local_ranks_[j], ")");
  }
  return out;
}

void ShmArena::barrier(Deadline deadline, const char* what) {
  const uint64_t n = ++barriers_;
  // seq_cst store and loads: of two ranks arriving last at the same time, at
  // least one sees the other's arrival, so at least one wakes the sleepers.
  // (The store also releases this rank's slot writes to the acquire loads
  // of allArrived() on the other side.)
  arrivals(local_rank_).store(n, std::memory_order_seq_cst);
  bool last = true;
  for (int j = 0; j < localSize() && last; ++j) last = arrivals(j).load(std::memory_order_seq_cst) >= n;
  if (last) {
    control()->barrier.notify();
    return;
  }
  const int self = local_ranks_[local_rank_];
  const auto arrived = [&] { return allArrived(n); };
  const auto gone = [&]() -> ShmGone {
    for (int j = 0; j < localSize(); ++j) {
      if (j == local_rank_ || arrivals(j).load(std::memory_order_acquire) >= n) continue;
      switch (seg_.peer(j)) {
        case ShmSegment::Peer::kDead:
          return strCat("rank ", self, ": peer rank ", local_ranks_[j], " (local rank ", j, ", pid ", seg_.pidOf(j),
                        ") died; node barrier ", what, " cannot complete");
        case ShmSegment::Peer::kDetached:
          // It left on purpose (a failure elsewhere stopped it): it says why on the control plane.
          return {strCat("rank ", self, ": peer rank ", local_ranks_[j], " (local rank ", j, ") left the node arena ",
                         seg_.name(), "; node barrier ", what, " cannot complete"),
                  true};
        default: break;
      }
    }
    return {};
  };
  try {
    shmWait(control()->barrier, deadline, arrived, gone, [&](std::chrono::milliseconds waited) {
      return strCat("rank ", self, ": timed out after ", waited.count(), " ms in node barrier ", what, " (segment ",
                    seg_.name(), "); still waiting for ", missing(n));
    });
  } catch (const PeerClosed&) {
    throw;
  } catch (const TimeoutError& timed_out) {
    // The local rank waited for is alive and attached: it may be failing the
    // same operation for a cause of its own at about the same moment (a
    // host's leader whose link to another host went down ends by the same
    // operation deadline). It leaves the arena as it fails, and its cause
    // then leads (PeerClosed: the engine waits for the word). Give it that
    // long before this timeout is the story.
    std::string told = timed_out.what();
    shmWait(control()->barrier, Deadline::after(kLeaveGrace), arrived, gone,
            [&](std::chrono::milliseconds) { return told; });
  }
}

}  // namespace hvdtorch
