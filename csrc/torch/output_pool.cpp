#include "output_pool.h"

#include <pthread.h>

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace hvdtorch {

namespace {

// Each pooled block starts with its size class; the data follows at an
// offset that keeps torch's CPU alignment.
constexpr size_t kHeader = 64;

size_t& classOf(void* block) { return *static_cast<size_t*>(block); }
void* dataOf(void* block) { return static_cast<char*>(block) + kHeader; }

}  // namespace

OutputPool& OutputPool::instance() {
  static OutputPool* pool = [] {
    // A child forked while another thread held the lock (a DataLoader worker
    // started while the engine's thread frees an output) gets it unlocked:
    // tensors it inherited come back through put() there too.
    pthread_atfork(nullptr, nullptr, [] { new (&instance().mu_) std::mutex(); });
    return new OutputPool();  // never destroyed: deleters may run at exit
  }();
  return *pool;
}

size_t OutputPool::sizeClass(size_t bytes) {
  size_t top = 1;
  while (top <= bytes / 2) top <<= 1;  // the largest power of two <= bytes
  const size_t step = top / 8;
  return (bytes + step - 1) / step * step;
}

void OutputPool::open(size_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = limit;
}

void OutputPool::close() {
  std::map<size_t, std::vector<void*>> freed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    limit_ = 0;
    kept_bytes_ = 0;
    freed.swap(kept_);
  }
  for (auto& [size, blocks] : freed)
    for (void* b : blocks) std::free(b);
}

at::DataPtr OutputPool::allocate(size_t bytes) {
  // Small blocks: the C library's heap keeps those anyway.
  if (bytes < kMinPooledBytes) return c10::GetCPUAllocator()->allocate(bytes);
  const size_t size = sizeClass(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (limit_ == 0) return c10::GetCPUAllocator()->allocate(bytes);  // closed
    auto it = kept_.find(size);
    if (it != kept_.end() && !it->second.empty()) {
      void* block = it->second.back();
      it->second.pop_back();
      kept_bytes_ -= size;
      ++counts_.reused;
      return {dataOf(block), block, &OutputPool::giveBack, at::Device(at::kCPU)};
    }
    ++counts_.fresh;
  }
  // Mapped outside the lock; put() frees it if the pool is closed by then.
  void* block = nullptr;
  if (posix_memalign(&block, kHeader, kHeader + size) != 0) throw std::bad_alloc();
  classOf(block) = size;
  return {dataOf(block), block, &OutputPool::giveBack, at::Device(at::kCPU)};
}

void OutputPool::copy_data(void* dest, const void* src, size_t count) const { std::memcpy(dest, src, count); }

void OutputPool::giveBack(void* block) { instance().put(block); }

void OutputPool::put(void* block) {
  const size_t size = classOf(block);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_.returned;
    if (kept_bytes_ + size <= limit_) {
      kept_[size].push_back(block);
      kept_bytes_ += size;
      return;
    }
    ++counts_.dropped;
  }
  std::free(block);
}

at::Tensor OutputPool::empty(at::IntArrayRef shape, at::ScalarType dtype) {
  return at::Tensor(at::detail::empty_generic(shape, this, c10::DispatchKeySet(c10::DispatchKey::CPU), dtype,
                                              c10::MemoryFormat::Contiguous));
}

OutputPool::Stats OutputPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = counts_;
  s.limit = limit_;
  s.kept_bytes = kept_bytes_;
  s.kept_blocks = 0;
  for (const auto& [size, blocks] : kept_) s.kept_blocks += blocks.size();
  return s;
}

}  // namespace hvdtorch
