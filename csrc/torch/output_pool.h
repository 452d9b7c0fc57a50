// Host memory for the tensors the collectives hand back fresh
// (`hvd.allreduce(x)`, allgather, broadcast, alltoall, reducescatter,
// reduce), reused from call to call.
//
// Why: a fresh CPU tensor of a few MiB or more is mapped by the C library
// on allocation and unmapped when freed, so every call faults its pages in
// again, which cost a 64 MiB all-reduce three times the reduction itself.
// Memory this pool keeps stays mapped and faulted in.
//
// The rule: a block of at least kMinPooledBytes is rounded up to its size
// class (eight classes per power of two, so at most 12.5% is unused) and,
// once the last tensor (or view) using it is freed, kept for the next
// allocation of that class, while the pool holds at most `limit` bytes
// (HVDTORCH_OUTPUT_POOL_BYTES; a block that would exceed it is freed).
// Smaller blocks, and every block while the pool is closed (limit 0, before
// init(), after shutdown()), come from torch's CPU allocator. A block is
// only ever reused after every tensor on it was freed (its deleter returns
// it), so a tensor the user keeps is never written under them.
//
// Storage made with the pool is resizable (resize_ allocates from it too).
// Thread-safety: every method, from any thread (deleters run wherever the
// last reference goes).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace hvdtorch {

class OutputPool final : public c10::Allocator {
 public:
  static constexpr size_t kMinPooledBytes = 128u << 10;  // glibc's first mmap threshold

  // The process's one pool (never destroyed: tensors may be freed at exit).
  static OutputPool& instance();

  // Opens the pool with room for `limit` bytes of freed blocks (init()); 0
  // keeps it closed.
  void open(size_t limit);
  // Closes it and frees every block it keeps (shutdown()); blocks returned
  // later are freed at once.
  void close();

  // An empty CPU tensor of `shape` and `dtype`, contiguous, on pooled memory.
  at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype);

  struct Stats {
    size_t limit = 0;       // bytes; 0: closed
    size_t kept_bytes = 0;  // freed blocks held for reuse
    size_t kept_blocks = 0;
    uint64_t reused = 0;    // allocations served from a kept block
    uint64_t fresh = 0;     // pooled-size allocations that had to map a new block
    uint64_t returned = 0;  // pooled blocks whose last tensor was freed (kept or dropped)
    uint64_t dropped = 0;   // of those, freed at once because the pool was full or closed
  };
  Stats stats() const;

  // The size class of an allocation of `bytes` (kMinPooledBytes or more).
  static size_t sizeClass(size_t bytes);

  // c10::Allocator
  at::DataPtr allocate(size_t bytes) override;
  void copy_data(void* dest, const void* src, size_t count) const override;

 private:
  OutputPool() = default;
  static void giveBack(void* block);  // the DataPtr's deleter
  void put(void* block);

  mutable std::mutex mu_;
  size_t limit_ = 0;
  size_t kept_bytes_ = 0;
  std::map<size_t, std::vector<void*>> kept_;  // size class -> blocks
  Stats counts_;
};

}  // namespace hvdtorch
