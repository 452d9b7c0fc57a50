#include "engine/execution/fusion_buffer.h"

#include <algorithm>
#include <cstdlib>
#include <new>

#include "common/error.h"

namespace hvdtorch {

void* FusionBuffer::reserve(size_t bytes, Device* pin_for) {
  if (bytes > capacity_) {
    const size_t cap = std::max(bytes, capacity_.load() * 2);
    pinning_.unpinAll();
    storage_.reset();  // the old buffer goes before the new one is made
    capacity_ = 0;
    if (registered_) {
      try {
        storage_ = registered_->allocate(cap);
      } catch (const CollectiveError&) {
        storage_ = nullptr;  // /dev/shm is full: plain memory works too, through the copy path
      }
    }
    if (!storage_) {
      void* p = nullptr;
      if (posix_memalign(&p, 64, cap) != 0) throw std::bad_alloc();
      storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
    }
    capacity_ = cap;
  }
  if (pin_for != nullptr) pinning_.pin(storage_.get(), capacity_.load(), *pin_for);
  return storage_.get();
}

}  // namespace hvdtorch
