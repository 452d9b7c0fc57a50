// ThreadSanitizer annotations for synchronisation through shared memory that
// one process maps more than once.
//
// Why: TSan keys an atomic's release/acquire history by the atomic's virtual
// address. Every party of a ShmSegment maps it with its own mmap(), so when
// several parties live in one process (the in-process tests run each rank as
// a thread, each with its own ShmLink ends), one atomic in the segment has a
// different address in each mapping. A release store through one mapping and
// the acquire load that reads its value through the other are then unrelated
// for TSan: an ordering that exists only through shared memory is invisible,
// and accesses to private memory ordered by it are reported as races. The
// ring all-reduce relies on exactly such an ordering (a region it sent from
// is overwritten by a later receive only after the peers took the send, see
// ring_allreduce.cc), hence ShmRing uses ShmSync next to its counters.
//
// ShmSync names a location by (segment name, byte offset in the segment),
// which is the same in every mapping, and maps it to an address in a
// process-wide table on which __tsan_release / __tsan_acquire are called
// beside the real atomic operations: release() before the releasing store,
// acquire() after the acquiring load. Two locations sharing a table entry
// (hash collision, or a name reused after its segment is gone) only add
// happens-before edges: that can hide a race, never report a false one.
//
// Other shared-memory users need no annotation today: the segment header and
// ShmArena's barrier order only bytes inside the segment, whose accesses TSan
// cannot relate across mappings anyway (each mapping has its own shadow), and
// the private memory around them is touched by one thread per rank.
//
// In builds without TSan, ShmSync is an empty class whose calls compile to
// nothing.
#pragma once

#include <cstddef>
#include <string>

#if defined(__SANITIZE_THREAD__)
#define HVDTORCH_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HVDTORCH_TSAN 1
#endif
#endif
#ifndef HVDTORCH_TSAN
#define HVDTORCH_TSAN 0
#endif

#if HVDTORCH_TSAN
#include <sanitizer/tsan_interface.h>

#include <cstdint>
#include <functional>
#endif

namespace hvdtorch {

#if HVDTORCH_TSAN

class ShmSync {
 public:
  ShmSync() = default;  // annotates nothing
  ShmSync(const std::string& segment, size_t offset) : key_(keyFor(segment, offset)) {}

  void release() const {
    if (key_) __tsan_release(key_);
  }
  void acquire() const {
    if (key_) __tsan_acquire(key_);
  }

 private:
  static void* keyFor(const std::string& segment, size_t offset) {
    constexpr size_t kKeys = size_t(1) << 14;
    static uint64_t keys[kKeys];  // only their addresses are used
    size_t h = std::hash<std::string>{}(segment);
    h ^= std::hash<size_t>{}(offset) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return &keys[h % kKeys];
  }

  void* key_ = nullptr;
};

#else

class ShmSync {
 public:
  constexpr ShmSync() = default;
  constexpr ShmSync(const std::string& /*segment*/, size_t /*offset*/) {}
  void release() const {}
  void acquire() const {}
};

#endif

}  // namespace hvdtorch
