// One direction of a shared-memory link: a single-producer/single-consumer
// byte ring. The control block and the data area live in a ShmSegment; this
// class is a non-owning view used by either side.
//
// Memory ordering: `head` counts bytes ever written, `tail` bytes ever
// consumed (64-bit, never wrap in practice). The producer copies into the
// free region, then publishes with head.store(release); the consumer reads
// head with acquire, so the bytes are visible before it copies them out, and
// publishes its progress with tail.store(release), so the producer (acquire)
// never overwrites bytes still being read. Each counter has one writer and
// sits on its own cache line. Under ThreadSanitizer, each publish and
// consume is also annotated (ShmSync), so that TSan sees these orderings
// when both ends are mappings in one process (see tsan.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/shm/tsan.h"
#include "transport/shm/wait.h"

namespace hvdtorch {

// All-zero is the initial state (empty ring, no sleepers).
struct alignas(64) ShmRingCtl {
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint64_t> tail;
  ShmSignal data;   // notified by the producer after head moves
  ShmSignal space;  // notified by the consumer after tail moves
};

class ShmRing {
 public:
  ShmRing() = default;
  // `piece` bounds the bytes moved per publish: smaller pieces let the
  // consumer copy out while the producer is still copying in. `segment` and
  // `ctl_offset` (the name of the segment holding `ctl` and its byte offset
  // there, the same for both ends) are used only under ThreadSanitizer.
  ShmRing(ShmRingCtl* ctl, char* buf, size_t capacity, size_t piece, const std::string& segment, size_t ctl_offset);

  size_t capacity() const { return cap_; }
  ShmSignal& dataSignal() { return ctl_->data; }
  ShmSignal& spaceSignal() { return ctl_->space; }

  // Producer side.
  size_t freeBytes() const {
    const uint64_t head = ctl_->head.load(std::memory_order_relaxed);
    const uint64_t tail = ctl_->tail.load(std::memory_order_acquire);
    tail_sync_.acquire();
    return cap_ - static_cast<size_t>(head - tail);
  }
  // Copies up to min(n, free space, piece) bytes in, publishes them and
  // wakes the consumer. Returns the number of bytes written (0 if full).
  size_t write(const void* src, size_t n);

  // Consumer side.
  size_t available() const {
    const uint64_t head = ctl_->head.load(std::memory_order_acquire);
    head_sync_.acquire();
    const uint64_t tail = ctl_->tail.load(std::memory_order_relaxed);
    return static_cast<size_t>(head - tail);
  }
  // Copies up to min(n, available, piece) bytes out, releases the space and
  // wakes the producer. Returns the number of bytes read (0 if empty).
  size_t read(void* dst, size_t n);

 private:
  ShmRingCtl* ctl_ = nullptr;
  char* buf_ = nullptr;
  size_t cap_ = 0;
  size_t piece_ = 0;
  // The counters as ThreadSanitizer sees them across mappings (tsan.h);
  // no storage and no code in other builds.
#if HVDTORCH_TSAN
  ShmSync head_sync_;
  ShmSync tail_sync_;
#else
  static constexpr ShmSync head_sync_{};
  static constexpr ShmSync tail_sync_{};
#endif
};

}  // namespace hvdtorch
