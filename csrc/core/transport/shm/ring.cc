#include "transport/shm/ring.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

namespace hvdtorch {

ShmRing::ShmRing(ShmRingCtl* ctl, char* buf, size_t capacity, size_t piece, const std::string& segment,
                 size_t ctl_offset)
    : ctl_(ctl), buf_(buf), cap_(capacity), piece_(piece) {
#if HVDTORCH_TSAN
  head_sync_ = ShmSync(segment, ctl_offset + offsetof(ShmRingCtl, head));
  tail_sync_ = ShmSync(segment, ctl_offset + offsetof(ShmRingCtl, tail));
#else
  (void)segment;
  (void)ctl_offset;
#endif
}

size_t ShmRing::write(const void* src, size_t n) {
  const uint64_t head = ctl_->head.load(std::memory_order_relaxed);  // only we write it
  const uint64_t tail = ctl_->tail.load(std::memory_order_acquire);
  tail_sync_.acquire();
  const size_t used = static_cast<size_t>(head - tail);
  const size_t k = std::min({n, cap_ - used, piece_});
  if (k == 0) return 0;
  const size_t at = static_cast<size_t>(head % cap_);
  const size_t first = std::min(k, cap_ - at);  // up to the end of the buffer, then wrap
  std::memcpy(buf_ + at, src, first);
  std::memcpy(buf_, static_cast<const char*>(src) + first, k - first);
  head_sync_.release();  // before the store: once it is seen, the edge must be there
  ctl_->head.store(head + k, std::memory_order_release);
  ctl_->data.notify();
  return k;
}

size_t ShmRing::read(void* dst, size_t n) {
  const uint64_t tail = ctl_->tail.load(std::memory_order_relaxed);  // only we write it
  const uint64_t head = ctl_->head.load(std::memory_order_acquire);
  head_sync_.acquire();
  const size_t avail = static_cast<size_t>(head - tail);
  const size_t k = std::min({n, avail, piece_});
  if (k == 0) return 0;
  const size_t at = static_cast<size_t>(tail % cap_);
  const size_t first = std::min(k, cap_ - at);
  std::memcpy(dst, buf_ + at, first);
  std::memcpy(static_cast<char*>(dst) + first, buf_, k - first);
  tail_sync_.release();
  ctl_->tail.store(tail + k, std::memory_order_release);
  ctl_->space.notify();
  return k;
}

}  // namespace hvdtorch
