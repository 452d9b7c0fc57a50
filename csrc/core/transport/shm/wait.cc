#include "transport/shm/wait.h"

#include <climits>
#include <thread>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace hvdtorch {

namespace {
std::atomic<int64_t> spin_budget_us{0};
}  // namespace

void setShmSpinBudget(std::chrono::microseconds budget) {
  spin_budget_us.store(budget.count(), std::memory_order_relaxed);
}

std::chrono::microseconds shmSpinBudget() {
  return std::chrono::microseconds(spin_budget_us.load(std::memory_order_relaxed));
}

namespace shm_detail {

void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// The futex word is shared between processes, so the non-private futex
// operations are used: the kernel keys them by the backing page, which works
// whatever address each process mapped the segment at.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout) {
#if defined(__linux__)
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1000000) * 1000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
#else
  (void)word;
  (void)expected;
  std::this_thread::sleep_for(timeout);
#endif
}

static void futexWakeAll(std::atomic<uint32_t>* word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
#else
  (void)word;
#endif
}

}  // namespace shm_detail

void ShmSignal::notify() {
  seq.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) != 0) shm_detail::futexWakeAll(&seq);
}

}  // namespace hvdtorch
