#include "algorithms/device_ring.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>

#include "common/error.h"

namespace hvdtorch {

namespace {

std::atomic<uint64_t> g_runs{0};

// What each rank offers its neighbours at setup.
struct Offer {
  IpcMemoryHandle memory;  // its allocation: the inbox, then the flags
};

// The 8-byte messages: kind in the top bit, the segment's sequence number below.
constexpr uint64_t kConsumed = uint64_t{1} << 63;
// The teardown's message (a "consumed" number no allreduce reaches).
constexpr uint64_t kClosed = ~uint64_t{0};

// The flags after the inbox's slots: ready[slots], then acked[slots] in
// the next 64 bytes (each 4 bytes; the page is 256 bytes).
constexpr size_t kFlagBytes = 256;
constexpr size_t kAckedAt = 64;
static_assert(DeviceRing::kMaxSlots * sizeof(uint32_t) <= kAckedAt, "flags overlap");

// What releaseWaits() writes ahead of the counters (waits compare modulo 2^32).
constexpr uint32_t kReleaseAhead = uint32_t{1} << 30;

// Host slots are page aligned (registered memory is pinned by pages).
constexpr size_t kHostAlign = 4096;

// Element ranges of the p ring chunks (the first count % p get one more).
size_t chunkBegin(size_t count, int p, int i) {
  const size_t base = count / p, extra = count % p;
  return static_cast<size_t>(i) * base + std::min<size_t>(static_cast<size_t>(i), extra);
}

}  // namespace

uint64_t DeviceRing::runs() { return g_runs.load(); }

bool DeviceRing::oneHost(const Context& ctx) {
  for (int r = 0; r < ctx.size(); ++r)
    if (!ctx.topo().sameHost(r)) return false;
  return true;
}

bool DeviceRing::applicable(const Context& ctx, const Device& device) {
  const int p = ctx.size();
  if (p < 2) return false;
  if (device.interprocess()) return true;
  // Without interprocess memory, only staged links: no two neighbours on one host.
  const std::vector<int>& host = ctx.topo().host_of_rank;
  for (int r = 0; r < p; ++r)
    if (host[r] == host[(r + 1) % p]) return false;
  return true;
}

DeviceRing::DeviceRing(Context& ctx, Device& device, const DeviceRingOptions& options)
    : ctx_(ctx), dev_(device), slot_bytes_(options.slot_bytes), slots_(options.slots) {
  if (slots_ < 1 || slots_ > kMaxSlots)
    throw InvalidArgument(strCat("device ring: ", slots_, " slots; 1 to ", kMaxSlots, " are possible"));
  const int p = ctx_.size(), me = ctx_.rank();
  next_ = (me + 1) % p;
  prev_ = (me + p - 1) % p;
  next_staged_ = !ctx_.topo().sameHost(next_);
  prev_staged_ = !ctx_.topo().sameHost(prev_);
  const size_t own_bytes = slots_ * slot_bytes_ + kFlagBytes;
  own_ = dev_.allocate(own_bytes);
  if (next_staged_ || prev_staged_) {
    // Two out slots, then two in slots; registered once, so the copies run at pinned speed.
    host_storage_ = std::make_unique<char[]>(4 * slot_bytes_ + kHostAlign);
    const auto at = reinterpret_cast<uintptr_t>(host_storage_.get());
    host_ = host_storage_.get() + ((kHostAlign - at % kHostAlign) % kHostAlign);
    dev_.registerHost(host_, 4 * slot_bytes_);
    copied_ = dev_.newEvent();
    for (auto& e : landed_) e = dev_.newEvent();
  }
  if (next_staged_ && prev_staged_) return;  // nothing to map
  // The flags start at zero, before any neighbour can see them.
  dev_.fill(static_cast<char*>(own_) + slots_ * slot_bytes_, kFlagBytes, 0, nullptr);
  auto zeroed = dev_.newEvent();
  dev_.record(*zeroed, nullptr);
  dev_.synchronize(*zeroed);
  // Each neighbour on this host (the one peer when p == 2) gets the offer
  // and opens it once: prev writes the inbox and its ready flags, next the
  // acked flags.
  const Offer mine{dev_.exportMemory(own_)};
  Offer from_prev, from_next;
  const bool one_peer = next_ == prev_;
  const Deadline deadline = ctx_.deadline();
  std::vector<std::unique_ptr<LinkRequest>> requests;
  if (!prev_staged_) requests.push_back(ctx_.link(prev_).irecv(&from_prev, sizeof(Offer)));
  if (!next_staged_ && !one_peer) requests.push_back(ctx_.link(next_).irecv(&from_next, sizeof(Offer)));
  if (!next_staged_ && !one_peer) requests.push_back(ctx_.link(next_).isend(&mine, sizeof(Offer)));
  if (!prev_staged_) requests.push_back(ctx_.link(prev_).isend(&mine, sizeof(Offer)));
  for (auto& r : requests) r->wait(deadline);
  if (!prev_staged_) prev_mem_ = dev_.openMemory(from_prev.memory);
  if (!next_staged_) next_mem_ = one_peer ? prev_mem_ : dev_.openMemory(from_next.memory);
}

DeviceRing::~DeviceRing() {
  // Nothing of ours may still be reading or writing. Without close() (the
  // engine failed) a peer may still have our memory mapped: freed anyway.
  releaseWaits();  // a wait for a dead peer's write would hold the stream forever
  try {
    drainEngineStream(dev_);
    unmapNeighbours();
  } catch (const std::exception& e) {
    // Shutting down after a failure: the device may be gone already. Say so and go on freeing.
    std::fprintf(stderr, "hvdtorch: rank %d: device ring teardown on %s: %s\n", ctx_.rank(), dev_.id().str().c_str(),
                 e.what());
  }
  dev_.release(own_);
  freeHostSlots(true);
}

uint32_t* DeviceRing::readyFlag(void* mem, uint64_t q) const {
  return reinterpret_cast<uint32_t*>(static_cast<char*>(mem) + slots_ * slot_bytes_) + q % slots_;
}

uint32_t* DeviceRing::ackedFlag(void* mem, uint64_t q) const {
  return reinterpret_cast<uint32_t*>(static_cast<char*>(mem) + slots_ * slot_bytes_ + kAckedAt) + q % slots_;
}

void DeviceRing::releaseWaits() {
  std::lock_guard<std::mutex> lk(release_mu_);
  if (own_ == nullptr || (next_staged_ && prev_staged_)) return;
  try {
    // On a stream of its own: the engine stream may be the one waiting.
    auto stream = dev_.newStream();
    const auto ready = static_cast<uint32_t>(received_.load()) + kReleaseAhead;
    const auto acked = static_cast<uint32_t>(sent_.load()) + kReleaseAhead;
    for (uint64_t k = 0; k < slots_; ++k) {
      dev_.writeFlag(readyFlag(own_, k), ready, stream.get());
      dev_.writeFlag(ackedFlag(own_, k), acked, stream.get());
    }
    auto written = dev_.newEvent();
    dev_.record(*written, stream.get());
    dev_.synchronize(*written);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hvdtorch: rank %d: releasing the device ring's waits on %s: %s\n", ctx_.rank(),
                 dev_.id().str().c_str(), e.what());
  }
}

void DeviceRing::unmapNeighbours() {
  if (next_mem_ != nullptr && next_mem_ != prev_mem_) dev_.closeMemory(next_mem_);
  if (prev_mem_ != nullptr) dev_.closeMemory(prev_mem_);
  next_mem_ = prev_mem_ = nullptr;
}

void DeviceRing::freeHostSlots(bool transfers_may_be_open) {
  if (host_ == nullptr) return;
  try {
    dev_.unregisterHost(host_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hvdtorch: rank %d: device ring host slots on %s: %s\n", ctx_.rank(), dev_.id().str().c_str(),
                 e.what());
  }
  host_ = nullptr;
  if (transfers_may_be_open) {
    ctx_.link(next_staged_ ? next_ : prev_).keepWhileOpen(std::move(host_storage_));
  } else {
    host_storage_.reset();
  }
}

void DeviceRing::close() {
  std::lock_guard<std::mutex> lk(release_mu_);
  if (own_ == nullptr) return;
  // Our copies into next's inbox and our kernels reading ours are done.
  drainEngineStream(dev_);
  unmapNeighbours();
  // Peers stop in the same cycle and have run the same units: a peer that
  // has not answered within seconds is not coming (the words are members:
  // a late delivery must not land in a dead stack frame).
  const Deadline deadline = Deadline::after(std::min(ctx_.timeout(), std::chrono::milliseconds(30000)));
  // Only a neighbour on this host maps our memory: the handshake runs on
  // those links, once per neighbour (one when p == 2).
  const bool one_peer = next_ == prev_;
  closed_out_ = kClosed;
  closed_in_[0] = prev_staged_ ? kClosed : 0;
  closed_in_[1] = next_staged_ || one_peer ? kClosed : 0;
  std::vector<std::unique_ptr<LinkRequest>> requests;
  if (!prev_staged_) requests.push_back(ctx_.link(prev_).irecv(&closed_in_[0], sizeof(uint64_t)));
  if (!next_staged_ && !one_peer) requests.push_back(ctx_.link(next_).irecv(&closed_in_[1], sizeof(uint64_t)));
  if (!next_staged_ && !one_peer) requests.push_back(ctx_.link(next_).isend(&closed_out_, sizeof(closed_out_)));
  if (!prev_staged_) requests.push_back(ctx_.link(prev_).isend(&closed_out_, sizeof(closed_out_)));
  for (auto& r : requests) r->wait(deadline);
  for (int side = 0; side < 2; ++side)
    if (closed_in_[side] != kClosed)
      throw CollectiveError(strCat("device ring teardown: rank ", ctx_.rank(), " expected 'closed' from rank ",
                                   side == 0 ? prev_ : next_, ", got message ", closed_in_[side]));
  dev_.release(own_);  // both neighbours have unmapped it
  own_ = nullptr;
  freeHostSlots(false);  // the engine stream is drained and every transfer waited for
}

void DeviceRing::send(const char* src, size_t bytes) {
  const uint64_t q = sent_.load(std::memory_order_relaxed);
  if (q >= slots_) {
    // The slot is free once next's kernel read segment q - slots_ out of it:
    // its message says the flag's write is enqueued.
    while (acked_ < q - slots_ + 1) {
      uint64_t word = 0;
      ctx_.link(next_).recv(&word, sizeof(word), ctx_.deadline());
      if (word == (kConsumed | acked_)) {
        ++acked_;
      } else if (!(word & kConsumed) && next_ == prev_) {
        // p == 2: the peer's data message came first; account for it.
        pending_data_.push_back(word);
      } else {
        throw CollectiveError(strCat("device ring: rank ", ctx_.rank(), " expected 'consumed ", acked_, "' from rank ",
                                     next_, ", got message ", word));
      }
    }
    dev_.waitFlag(ackedFlag(own_, q), static_cast<uint32_t>(q - slots_ + 1), nullptr);
  }
  dev_.copy(static_cast<char*>(next_mem_) + (q % slots_) * slot_bytes_, src, bytes, nullptr);
  dev_.writeFlag(readyFlag(next_mem_, q), static_cast<uint32_t>(q + 1), nullptr);
  sent_.store(q + 1, std::memory_order_relaxed);
  out_words_.push_back(q);
  out_requests_.push_back(ctx_.link(next_).isend(&out_words_.back(), sizeof(uint64_t)));
}

void DeviceRing::receive(char* dst, size_t bytes, DataType dtype, bool reduce, ReduceOp op) {
  const uint64_t q = received_.load(std::memory_order_relaxed);
  uint64_t word = 0;
  if (!pending_data_.empty()) {
    word = pending_data_.front();
    pending_data_.pop_front();
  } else {
    while (true) {
      ctx_.link(prev_).recv(&word, sizeof(word), ctx_.deadline());
      if (!(word & kConsumed) || next_ != prev_) break;
      if (word != (kConsumed | acked_))
        throw CollectiveError(strCat("device ring: rank ", ctx_.rank(), " got 'consumed' message ", word,
                                     " out of order from rank ", next_));
      ++acked_;  // p == 2: the peer's consumed message came first
    }
  }
  if (word != q)
    throw CollectiveError(strCat("device ring: rank ", ctx_.rank(), " expected segment ", q, " from rank ", prev_,
                                 ", got message ", word));
  dev_.waitFlag(readyFlag(own_, q), static_cast<uint32_t>(q + 1), nullptr);
  const char* slot = static_cast<const char*>(own_) + (q % slots_) * slot_bytes_;
  if (reduce) {
    dev_.reduceInto(dst, slot, bytes / dtypeSize(dtype), dtype, op, nullptr);
  } else {
    dev_.copy(dst, slot, bytes, nullptr);
  }
  dev_.writeFlag(ackedFlag(prev_mem_, q), static_cast<uint32_t>(q + 1), nullptr);
  received_.store(q + 1, std::memory_order_relaxed);
  out_words_.push_back(kConsumed | q);
  out_requests_.push_back(ctx_.link(prev_).isend(&out_words_.back(), sizeof(uint64_t)));
}

void DeviceRing::sendStaged(const char* src, size_t bytes) {
  const uint64_t q = sent_++;
  const int k = static_cast<int>(q % 2);
  char* slot = host_ + k * slot_bytes_;
  if (staged_sends_[k]) {  // segment q-2 left this slot
    staged_sends_[k]->wait(ctx_.deadline());
    staged_sends_[k].reset();
  }
  dev_.copyToHost(slot, src, bytes, nullptr);
  dev_.record(*copied_, nullptr);
  dev_.synchronize(*copied_);
  staged_sends_[k] = ctx_.link(next_).isend(slot, bytes);
}

void DeviceRing::receiveStaged(char* dst, size_t bytes, DataType dtype, bool reduce, ReduceOp op) {
  const uint64_t q = received_++;
  const int k = static_cast<int>(q % 2);
  char* slot = host_ + (2 + k) * slot_bytes_;
  // The copy of the segment before (maybe of the previous all-reduce) out of this slot is done.
  if (landed_valid_ & (uint64_t{1} << k)) dev_.synchronize(*landed_[k]);
  ctx_.link(prev_).recv(slot, bytes, ctx_.deadline());
  if (reduce) {
    char* in = static_cast<char*>(own_) + k * slot_bytes_;  // after this slot's last kernel: stream order
    dev_.copyFromHost(in, slot, bytes, nullptr);
    dev_.reduceInto(dst, in, bytes / dtypeSize(dtype), dtype, op, nullptr);
  } else {
    dev_.copyFromHost(dst, slot, bytes, nullptr);
  }
  dev_.record(*landed_[k], nullptr);
  landed_valid_ |= uint64_t{1} << k;
}

void DeviceRing::drain() {
  if (next_staged_) {
    for (auto& s : staged_sends_) {
      if (s) s->wait(ctx_.deadline());
      s.reset();
    }
    for (auto& r : out_requests_) r->wait(ctx_.deadline());
    return;
  }
  // Every "consumed" message next still owes us, so the links are clean
  // (the next all-reduce's copies into next's slots wait on the flags).
  while (acked_ < sent_.load(std::memory_order_relaxed)) {
    uint64_t word = 0;
    ctx_.link(next_).recv(&word, sizeof(word), ctx_.deadline());
    if (word != (kConsumed | acked_))
      throw CollectiveError(strCat("device ring: rank ", ctx_.rank(), " expected 'consumed ", acked_, "' from rank ",
                                   next_, ", got message ", word));
    ++acked_;
  }
  for (auto& r : out_requests_) r->wait(ctx_.deadline());
}

void DeviceRing::allreduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  const int p = ctx_.size(), me = ctx_.rank();
  if (p == 1 || count == 0) return;
  ++g_runs;
  // The segment numbers go on from the last all-reduce (the flags count them).
  pending_data_.clear();
  out_words_.clear();
  out_requests_.clear();
  const size_t esize = dtypeSize(dtype);
  const size_t seg_elems = std::max<size_t>(1, slot_bytes_ / esize);
  char* base = static_cast<char*>(data);
  auto chunk = [&](int i, size_t& begin, size_t& n) {
    const int c = ((i % p) + p) % p;
    begin = chunkBegin(count, p, c);
    n = chunkBegin(count, p, c + 1) - begin;
  };
  // Reduce-scatter (reduce = true) then all-gather, p-1 steps each.
  for (int phase = 0; phase < 2; ++phase) {
    for (int s = 0; s < p - 1; ++s) {
      size_t sb, sn, rb, rn;
      if (phase == 0) {
        chunk(me - s, sb, sn);
        chunk(me - s - 1, rb, rn);
      } else {
        chunk(me + 1 - s, sb, sn);
        chunk(me - s, rb, rn);
      }
      const size_t ns = (sn + seg_elems - 1) / seg_elems, nr = (rn + seg_elems - 1) / seg_elems;
      for (size_t j = 0; j < std::max(ns, nr); ++j) {
        if (j < ns) {
          const size_t off = sb + j * seg_elems, n = std::min(seg_elems, sb + sn - off);
          if (next_staged_) {
            sendStaged(base + off * esize, n * esize);
          } else {
            send(base + off * esize, n * esize);
          }
        }
        if (j < nr) {
          const size_t off = rb + j * seg_elems, n = std::min(seg_elems, rb + rn - off);
          if (prev_staged_) {
            receiveStaged(base + off * esize, n * esize, dtype, phase == 0, op);
          } else {
            receive(base + off * esize, n * esize, dtype, phase == 0, op);
          }
        }
      }
    }
  }
  drain();
}

}  // namespace hvdtorch
