#include "transport/shm/host_gather.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>

#include "common/error.h"
#include "transport/shm/wait.h"

namespace hvdtorch {

namespace {

size_t roundUp64(size_t n) { return (n + 63) / 64 * 64; }

// The control segment's user region starts with this; the slot records and
// then the bucket records follow.
struct Control {
  ShmSignal signal;
  alignas(64) std::atomic<uint64_t> slots_made;
};

// A bucket record's `slot` word: the gather it belongs to and its slot + 1.
constexpr int kSlotBits = 24;
uint64_t slotWord(uint64_t gen, int slot) { return (gen << kSlotBits) | static_cast<uint64_t>(slot + 1); }

}  // namespace

// Bucket j's counters in the control segment (all zero initially):
// cleared (the last gather released by every local rank), releases (total
// releases of all gathers: the release that makes it parties x n is the
// last of gather n, and frees its slot), slot (slotWord of the current
// gather), then put[party] and released[party] (the last gather each local
// rank put / released).
struct HostGather::Record {
  std::atomic<uint64_t>* cleared;
  std::atomic<uint64_t>* releases;
  std::atomic<uint64_t>* slot;
  std::atomic<uint64_t>* put;
  std::atomic<uint64_t>* released;
};

// Slot k: busy (1 while a gather holds it, or a rank is taking it) and its
// maker's party + 1 (0 until the maker has said).
struct HostGather::SlotRecord {
  std::atomic<uint64_t>* busy;
  std::atomic<uint64_t>* maker;
};

HostGather::HostGather(std::string name, int party, std::vector<int> party_ranks, std::vector<size_t> bucket_bytes,
                       std::chrono::milliseconds timeout)
    : name_(std::move(name)),
      party_(party),
      party_ranks_(std::move(party_ranks)),
      bucket_bytes_(std::move(bucket_bytes)),
      timeout_(timeout),
      local_(bucket_bytes_.size()) {
  const int n = parties();
  if (n < 1 || party < 0 || party >= n)
    throw InvalidArgument(strCat("host gather ", name_, ": bad party ", party, " of ", n));
  slot_bytes_ = 0;
  for (size_t j = 0; j < bucket_bytes_.size(); ++j) {
    if (bucket_bytes_[j] == 0) throw InvalidArgument(strCat("host gather ", name_, ": bucket ", j, " has no bytes"));
    slot_bytes_ = std::max(slot_bytes_, bucket_bytes_[j]);
  }
  // Every bucket's gather may hold a slot at once, and ranks racing for a
  // new one may each make one (the losers' stay free for later gathers).
  max_slots_ = static_cast<int>(bucket_bytes_.size()) * n + 1;
  slots_.resize(max_slots_);
  record_stride_ = roundUp64((3 + 2 * static_cast<size_t>(n)) * sizeof(std::atomic<uint64_t>));
  records_offset_ = roundUp64(sizeof(Control) + static_cast<size_t>(max_slots_) * 2 * sizeof(std::atomic<uint64_t>));
  const size_t bytes = records_offset_ + record_stride_ * std::max<size_t>(bucket_bytes_.size(), 1);
  const int self = party_ranks_[party];
  const std::string control = name_ + "-c";
  control_ = party == 0 ? ShmSegment::create(control, bytes, n, self)
                        : ShmSegment::open(control, bytes, n, party, self, party_ranks_[0], Deadline::after(timeout_));
}

HostGather::~HostGather() = default;

HostGather::Record HostGather::record(int j) const {
  auto* base = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(control_.data()) + records_offset_ +
                                                        record_stride_ * static_cast<size_t>(j));
  return {base, base + 1, base + 2, base + 3, base + 3 + parties()};
}

HostGather::SlotRecord HostGather::slotRecord(int k) const {
  auto* base = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(control_.data()) + sizeof(Control));
  const ptrdiff_t at = 2 * static_cast<ptrdiff_t>(k);
  return {base + at, base + at + 1};
}

int HostGather::slots() const {
  return static_cast<int>(
      std::min<uint64_t>(static_cast<Control*>(control_.data())->slots_made.load(std::memory_order_acquire),
                         static_cast<uint64_t>(max_slots_)));
}

void HostGather::check(int j, Stage expected, const char* call) const {
  if (j < 0 || static_cast<size_t>(j) >= local_.size())
    throw InvalidArgument(strCat("host gather ", name_, ": ", call, " of bucket ", j, " of ", local_.size()));
  if (local_[j].stage != expected)
    throw InvalidArgument(strCat("host gather ", name_, ": ", call, " of bucket ", j, " out of order (put, await, ",
                                 "release for each gather)"));
}

const std::shared_ptr<ShmSegment>& HostGather::mapSlot(int k) {
  if (slots_[k]) return slots_[k];
  const SlotRecord s = slotRecord(k);
  // The maker says who it is right after counting the slot: a short wait at most.
  const auto said = [&] { return s.maker->load(std::memory_order_acquire) != 0; };
  wait(said, [] { return std::string("the rank making it to say so"); }, strCat("slot ", k, " of host gather ", name_));
  const int maker = static_cast<int>(s.maker->load(std::memory_order_acquire)) - 1;
  const int n = parties();
  const std::string name = strCat(name_, "-s", k);
  const int self = party_ranks_[party_];
  slots_[k] = std::make_shared<ShmSegment>(maker == party_
                                               ? ShmSegment::create(name, slot_bytes_, n, self)
                                               : ShmSegment::open(name, slot_bytes_, n, (party_ - maker + n) % n, self,
                                                                  party_ranks_[maker], Deadline::after(timeout_)));
  return slots_[k];
}

int HostGather::slotFor(int j, uint64_t gen) {
  const Record r = record(j);
  uint64_t seen = r.slot->load(std::memory_order_acquire);
  if ((seen >> kSlotBits) == gen) return static_cast<int>(seen & ((uint64_t{1} << kSlotBits) - 1)) - 1;
  auto* control = static_cast<Control*>(control_.data());
  int k = -1;
  while (k < 0) {
    const int made = slots();
    for (int i = 0; i < made && k < 0; ++i) {
      uint64_t free = 0;
      if (slotRecord(i).busy->compare_exchange_strong(free, 1, std::memory_order_acq_rel)) k = i;
    }
    if (k >= 0) break;
    const uint64_t fresh = control->slots_made.fetch_add(1, std::memory_order_acq_rel);
    if (fresh >= static_cast<uint64_t>(max_slots_))
      throw CollectiveError(strCat("rank ", party_ranks_[party_], ": host gather ", name_, " ran out of slots (",
                                   max_slots_, "): the ranks do not release their gathers"));
    const SlotRecord s = slotRecord(static_cast<int>(fresh));
    s.maker->store(static_cast<uint64_t>(party_) + 1, std::memory_order_release);
    mapSlot(static_cast<int>(fresh));  // made now: the others open it when they need it
    uint64_t free = 0;
    if (s.busy->compare_exchange_strong(free, 1, std::memory_order_acq_rel)) k = static_cast<int>(fresh);
  }
  // This gather's slot is whichever rank's says so first; a slot taken in vain is free again.
  if (r.slot->compare_exchange_strong(seen, slotWord(gen, k), std::memory_order_acq_rel)) return k;
  slotRecord(k).busy->store(0, std::memory_order_release);
  return static_cast<int>(seen & ((uint64_t{1} << kSlotBits) - 1)) - 1;
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

bool HostGather::put(int j, const std::vector<Piece>& pieces, bool wait_for_release) {
  if (j >= 0 && static_cast<size_t>(j) < local_.size() && local_[j].stage == Stage::kIdle) {
    local_[j].stage = Stage::kBegun;
    ++local_[j].gen;
  }
  check(j, Stage::kBegun, "put");
  for (const Piece& p : pieces)
    if (p.offset + p.bytes > bucket_bytes_[j] || (p.bytes > 0 && p.src == nullptr))
      throw InvalidArgument(strCat("host gather ", name_, ": put of bytes [", p.offset, ", ", p.offset + p.bytes,
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
  const int k = slotFor(j, gen);
  char* base = static_cast<char*>(mapSlot(k)->data());
  for (const Piece& p : pieces)
    if (p.bytes > 0) std::memcpy(base + p.offset, p.src, p.bytes);
  // seq_cst: pairs with the waiters' loads as in ShmArena's barrier (one of
  // two last arrivals sees the other and wakes the sleepers).
  r.put[party_].store(gen, std::memory_order_seq_cst);
  static_cast<Control*>(control_.data())->signal.notify();
  local_[j].stage = Stage::kPut;
  local_[j].slot = k;
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
  const std::shared_ptr<ShmSegment>& seg = slots_[local_[j].slot];
  return std::shared_ptr<char>(seg, static_cast<char*>(seg->data()));
}

void HostGather::release(int j) {
  check(j, Stage::kHeld, "release");
  const uint64_t gen = local_[j].gen;
  const Record r = record(j);
  r.released[party_].store(gen, std::memory_order_release);
  // Exactly one release of this gather sees the count reach parties x gen:
  // every other rank is done with the slot, which any gather may take now.
  if (r.releases->fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint64_t>(parties()) * gen) {
    slotRecord(local_[j].slot).busy->store(0, std::memory_order_release);
    r.cleared->store(gen, std::memory_order_seq_cst);
    static_cast<Control*>(control_.data())->signal.notify();
  }
  local_[j].stage = Stage::kIdle;
  local_[j].slot = -1;
}

}  // namespace hvdtorch
