// What the simulated device adds to the Device contract (which
// test_device_contract_sim checks): a host dereference of device memory
// dies with SIGSEGV; a missing wait between two streams is visible (stale
// data, or a ThreadSanitizer report in a TSan build) while the same with the
// wait is always right; interprocess memory and events across two
// processes; a release of memory a peer still has open counted; stream
// seeds apart per rank; nothing left behind (threads, /dev/shm); bad
// pointers named.
//
// Children are forked while this process runs no stream thread (every
// device of an earlier test is destroyed by then), so they may start their
// own.
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "device/cpu_device.h"
#include "device/sim_device.h"

using namespace hvdtorch;

namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool kTsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kTsan = true;
#else
constexpr bool kTsan = false;
#endif
#else
constexpr bool kTsan = false;
#endif
constexpr int kTsanExitCode = 66;  // ThreadSanitizer's exit status after a report

SimOptions options(uint64_t seed, bool interprocess = false) {
  SimOptions o;
  o.seed = seed;
  o.max_delay_us = 300;
  o.interprocess = interprocess;
  return o;
}

void finish(Device& d, Stream* s) {
  auto e = d.newEvent();
  d.record(*e, s);
  d.synchronize(*e);
}

// Names in /dev/shm made by simulated devices of process `pid`.
std::vector<std::string> shmLeft(pid_t pid) {
  const std::string prefix = "hvdtorch-sim-" + std::to_string(pid) + "-";
  std::vector<std::string> found;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* e = readdir(dir))
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) found.emplace_back(e->d_name);
    closedir(dir);
  }
  return found;
}

int threadCount() {
  int n = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* e = readdir(dir))
      if (e->d_name[0] != '.') ++n;
    closedir(dir);
  }
  return n;
}

// A forked child and a pipe each way. Each side holds its own ends: `in`
// reads what the other side writes to its `out` (the other ends are closed).
struct Forked {
  pid_t pid;
  int in, out;
  void closePipes() const {
    close(in);
    close(out);
  }
};

Forked forkWithPipes() {
  int p2c[2], c2p[2];
  CHECK(pipe(p2c) == 0 && pipe(c2p) == 0);
  std::fflush(nullptr);  // buffered output would be written by both processes
  const pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    close(p2c[1]);
    close(c2p[0]);
    return {0, p2c[0], c2p[1]};
  }
  close(p2c[0]);
  close(c2p[1]);
  return {pid, c2p[0], p2c[1]};
}

// Waits for the child, killing it after `seconds`; returns its wait status.
int reap(pid_t child, int seconds) {
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "child %d still running after %d s: killed\n", int(child), seconds);
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status;
}

bool writeAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = write(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Reads n bytes, or fails after `seconds`.
bool readAll(int fd, void* p, size_t n, int seconds) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, seconds * 1000) <= 0) return false;
    const ssize_t k = read(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

}  // namespace

TEST(sim_host_dereference_dies_with_sigsegv) {
  auto d = makeSimDevice(options(1));
  auto* p = static_cast<int32_t*>(d->allocate(4096));
  d->fill(p, 4096, 0, nullptr);
  finish(*d, nullptr);
  for (bool write_it : {false, true}) {
    std::fflush(nullptr);  // the child must not flush a copy of what is buffered
    const pid_t child = fork();
    if (child == 0) {
      signal(SIGSEGV, SIG_DFL);  // the default action, even where a sanitizer installed a handler
      volatile int32_t* v = p;
      if (write_it) {
        *v = 1;
      } else {
        const int32_t x = *v;
        (void)x;
      }
      _exit(0);  // the access went through: the memory is readable by the host
    }
    const int status = reap(child, 30);
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV,
              "a host %s of a device pointer: status %d (exited %d, signal %d), want SIGSEGV",
              write_it ? "write" : "read", status, WIFEXITED(status) ? WEXITSTATUS(status) : -1,
              WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  }
  d->release(p);
}

namespace {

// One trial: the producer stream overwrites x (zeros) with ones; the
// consumer stream copies x to the host, after a wait on the producer's event
// or without one. Returns whether the consumer saw all ones.
bool consumerSawProducer(uint64_t seed, bool with_wait) {
  const size_t n = 4096;
  auto d = makeSimDevice(options(seed));
  auto producer = d->newStream();
  auto consumer = d->newStream();
  void* x = d->allocate(n * 4);
  d->fill(x, n * 4, 0, nullptr);
  finish(*d, nullptr);
  std::vector<int32_t> ones(n, 1), out(n, -1);
  d->copyFromHost(x, ones.data(), n * 4, producer.get());
  auto ready = d->newEvent();
  d->record(*ready, producer.get());
  if (with_wait) d->wait(consumer.get(), *ready);
  d->copyToHost(out.data(), x, n * 4, consumer.get());
  finish(*d, consumer.get());
  finish(*d, producer.get());
  d->release(x);
  return out == ones;
}

}  // namespace

// The simulator exposes a missing wait: without it, at least one of 20
// seeded trials shows the consumer stale data (in a TSan build, the child
// running them is stopped by the data race report instead); with the wait,
// every trial is right.
TEST(sim_missing_wait_is_caught) {
  constexpr int kTrials = 20;
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    for (int seed = 1; seed <= kTrials; ++seed) {
      if (!consumerSawProducer(static_cast<uint64_t>(seed), false)) {
        std::printf("  without the wait, seed %d: the consumer read stale data\n", seed);
        std::fflush(stdout);
        _exit(0);
      }
    }
    _exit(1);
  }
  if (kTsan) std::printf("  (a ThreadSanitizer data race report from the child is expected here)\n");
  std::fflush(stdout);
  const int status = reap(child, 60);
  const bool stale_seen = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  const bool tsan_report = kTsan && WIFEXITED(status) && WEXITSTATUS(status) == kTsanExitCode;
  CHECK_MSG(stale_seen || tsan_report, "no trial of %d without a wait showed the missing ordering (status %d)", kTrials,
            status);
  for (int seed = 1; seed <= kTrials; ++seed)
    CHECK_MSG(consumerSawProducer(static_cast<uint64_t>(seed), true), "with the wait, seed %d read stale data", seed);
}

// Two processes: the parent exports a buffer and an interprocess event and
// records the event after writing the buffer in six operations on a stream
// with long delays (up to 20 ms each); the child opens both, waits on the
// event, checks the data, adds to it in six slow operations and records the
// event itself; the parent waits on that record and sees the sum. Without
// the waits, each side would read well before the other's writes ran.
TEST(sim_interprocess_memory_and_events) {
  const size_t n = 1 << 14;
  const Forked f = forkWithPipes();
  const pid_t child = f.pid;
  if (child == 0) {
    IpcMemoryHandle mh;
    IpcEventHandle eh;
    if (!readAll(f.in, &mh, sizeof(mh), 30) || !readAll(f.in, &eh, sizeof(eh), 30)) _exit(2);
    int rc = 0;
    try {
      SimOptions o = options(7, true);
      o.max_delay_us = 20000;
      auto d = makeSimDevice(o);
      auto* x = static_cast<int32_t*>(d->openMemory(mh));
      auto ready = d->openEvent(eh);
      auto s = d->newStream();
      d->wait(s.get(), *ready);
      std::vector<int32_t> out(n, -1);
      d->copyToHost(out.data(), x, n * 4, s.get());
      finish(*d, s.get());
      for (size_t i = 0; i < n; ++i)
        if (out[i] != int32_t(i) + 5) rc = 3;
      std::vector<int32_t> twenties(n, 20);
      void* y = d->allocate(n * 4);
      d->copyFromHost(y, twenties.data(), n * 4, s.get());
      for (int k = 0; k < 5; ++k) d->reduceInto(x, y, n, DataType::kInt32, ReduceOp::kSum, s.get());
      d->record(*ready, s.get());
      const char go = 'r';
      if (!writeAll(f.out, &go, 1)) rc = 4;
      finish(*d, s.get());
      d->release(y);
      d->closeMemory(x);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      rc = 5;
    }
    _exit(rc);
  }
  {
    SimOptions o = options(8, true);
    o.max_delay_us = 20000;
    auto d = makeSimDevice(o);
    auto* x = static_cast<int32_t*>(d->allocate(n * 4));
    auto* ones = static_cast<int32_t*>(d->allocate(n * 4));
    auto ready = d->newEvent(true);
    auto s = d->newStream();
    std::vector<int32_t> iota(n);
    for (size_t i = 0; i < n; ++i) iota[i] = int32_t(i);
    d->fill(x, n * 4, 0xff, s.get());
    d->copyFromHost(x, iota.data(), n * 4, s.get());
    const std::vector<int32_t> host_ones(n, 1);
    d->copyFromHost(ones, host_ones.data(), n * 4, s.get());
    for (int k = 0; k < 5; ++k) d->reduceInto(x, ones, n, DataType::kInt32, ReduceOp::kSum, s.get());
    d->record(*ready, s.get());
    CHECK_THROWS(d->openMemory(d->exportMemory(x)), InvalidArgument);  // a process cannot open its own handle
    const IpcMemoryHandle mh = d->exportMemory(x);
    const IpcEventHandle eh = d->exportEvent(*ready);
    CHECK(writeAll(f.out, &mh, sizeof(mh)) && writeAll(f.out, &eh, sizeof(eh)));
    char go = 0;
    CHECK_MSG(readAll(f.in, &go, 1, 60) && go == 'r', "the child never recorded the event");
    d->wait(nullptr, *ready);  // binds to the child's record
    std::vector<int32_t> out(n, -1);
    d->copyToHost(out.data(), x, n * 4, nullptr);
    finish(*d, nullptr);
    bool sums = true;
    for (size_t i = 0; i < n; ++i) sums = sums && out[i] == int32_t(i) + 105;
    CHECK_MSG(sums, "the parent did not see the child's sum: out[1] = %d", out[1]);
    const int status = reap(child, 60);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d (3: wrong data, 5: an exception)",
              status);
    d->release(x);
    d->release(ones);
  }
  f.closePipes();
  CHECK(shmLeft(getpid()).empty());
  CHECK(shmLeft(child).empty());
}

// The detector the device ring's teardown tests rely on: releasing
// interprocess memory that a peer process still has open is counted (CUDA
// IPC leaves it undefined), and releasing it after the peer closed it is not.
TEST(sim_release_while_a_peer_has_it_open_is_counted) {
  const Forked f = forkWithPipes();
  const pid_t child = f.pid;
  if (child == 0) {
    // For each of two handles: open it, say so, wait for the word to close it
    // ('c': now; 'r': the parent released it already), close it, say so.
    int rc = 0;
    try {
      auto d = makeSimDevice(options(9, true));
      for (int k = 0; k < 2 && rc == 0; ++k) {
        IpcMemoryHandle h;
        char word = 0;
        if (!readAll(f.in, &h, sizeof(h), 30)) _exit(2);
        void* x = d->openMemory(h);
        const char opened = 'o', closed = 'c';
        if (!writeAll(f.out, &opened, 1) || !readAll(f.in, &word, 1, 30)) rc = 3;
        d->closeMemory(x);
        if (!writeAll(f.out, &closed, 1)) rc = 3;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      rc = 4;
    }
    _exit(rc);
  }
  {
    auto d = makeSimDevice(options(10, true));
    char word = 0;
    // Released while the child has it open: counted.
    void* x = d->allocate(4096);
    const IpcMemoryHandle hx = d->exportMemory(x);
    CHECK(writeAll(f.out, &hx, sizeof(hx)));
    CHECK_MSG(readAll(f.in, &word, 1, 60) && word == 'o', "the child did not open the first allocation");
    const uint64_t before = simReleasedWhileOpen();
    d->release(x);
    CHECK_MSG(simReleasedWhileOpen() == before + 1, "released while a peer had it open: counted %llu, want %llu",
              static_cast<unsigned long long>(simReleasedWhileOpen()), static_cast<unsigned long long>(before + 1));
    const char released = 'r';
    CHECK(writeAll(f.out, &released, 1));
    CHECK_MSG(readAll(f.in, &word, 1, 60) && word == 'c', "the child did not close the first allocation");
    // Released after the child closed it: not counted.
    void* y = d->allocate(4096);
    const IpcMemoryHandle hy = d->exportMemory(y);
    CHECK(writeAll(f.out, &hy, sizeof(hy)));
    CHECK_MSG(readAll(f.in, &word, 1, 60) && word == 'o', "the child did not open the second allocation");
    const char close_it = 'c';
    CHECK(writeAll(f.out, &close_it, 1));
    CHECK_MSG(readAll(f.in, &word, 1, 60) && word == 'c', "the child did not close the second allocation");
    d->release(y);
    CHECK_MSG(simReleasedWhileOpen() == before + 1, "released after the peer closed it: counted %llu, want %llu",
              static_cast<unsigned long long>(simReleasedWhileOpen()), static_cast<unsigned long long>(before + 1));
  }
  const int status = reap(child, 60);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d (3: pipe, 4: an exception)", status);
  f.closePipes();
}

TEST(sim_leaves_nothing_behind) {
  const int threads_before = threadCount();
  {
    auto d = makeSimDevice(options(3, true));
    void* a = d->allocate(100);
    void* b = d->allocate(1 << 20);
    d->allocate(10);  // never released: the destructor frees it
    auto e1 = d->newEvent(true);
    auto e2 = d->newEvent(true);
    auto s1 = d->newStream();
    auto s2 = d->newStream();
    d->fill(b, 1 << 20, 1, s1.get());
    d->record(*e1, s1.get());
    d->wait(s2.get(), *e1);
    CHECK(shmLeft(getpid()).size() == 5);  // three buffers, two events: the check below is not vacuous
    CHECK(threadCount() == threads_before + 3);
    d->release(a);
    CHECK(shmLeft(getpid()).size() == 4);
    (void)e2;
  }
  CHECK_MSG(shmLeft(getpid()).empty(), "%zu names left in /dev/shm", shmLeft(getpid()).size());
  CHECK_MSG(threadCount() == threads_before, "%d threads, %d before", threadCount(), threads_before);
}

// A stream flag waited for and never written: the simulator lets the wait
// go after SimOptions::flag_timeout_ms and reports it (stderr, and the
// device's sticky error from the next synchronize), where a GPU would hang
// the stream for good. A flag in host memory or unaligned is refused.
TEST(sim_flag_never_written_is_reported) {
  SimOptions o = options(5);
  o.flag_timeout_ms = 100;
  auto d = makeSimDevice(o);
  char* flag = static_cast<char*>(d->allocate(64));
  d->fill(flag, 64, 0, nullptr);
  d->waitFlag(flag, 3, nullptr);
  auto after = d->newEvent();
  d->record(*after, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  bool thrown = false;
  try {
    d->synchronize(*after);
  } catch (const CollectiveError& e) {
    thrown = std::strstr(e.what(), "waitFlag") != nullptr && std::strstr(e.what(), "nothing writes") != nullptr;
    CHECK_MSG(thrown, "message: %s", e.what());
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK_MSG(thrown, "a wait for a value never written was not reported");
  CHECK_MSG(waited >= 0.09 && waited < 5.0, "reported after %.3f s (timeout 0.1 s)", waited);
  uint32_t host_flag = 0;
  CHECK_THROWS(d->waitFlag(&host_flag, 1, nullptr), InvalidArgument);  // host memory
  CHECK_THROWS(d->writeFlag(flag + 2, 1, nullptr), InvalidArgument);   // unaligned
  d->release(flag);
}

// Copies through pageable (unregistered) host memory follow CUDA: a copy to
// the host returns only once it ran, so a host thread that copies behind a
// wait for a flag nobody has written yet blocks until it is written (on a
// GPU, forever if the writer is the same thread: the deadlock the flag tests
// must avoid); a copy from the host stages the bytes, so the caller may
// overwrite its memory at once. Through registered memory both return at once.
TEST(sim_pageable_copies_follow_cuda) {
  auto d = makeSimDevice(options(6));
  char* flag = static_cast<char*>(d->allocate(64));
  char* x = static_cast<char*>(d->allocate(64));
  d->fill(flag, 64, 0, nullptr);
  d->fill(x, 64, 7, nullptr);
  finish(*d, nullptr);
  auto waiter = d->newStream();
  auto writer = d->newStream();
  d->waitFlag(flag, 1, waiter.get());
  std::atomic<bool> returned{false};
  char seen[64] = {};
  std::thread copier([&] {
    d->copyToHost(seen, x, 64, waiter.get());
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_MSG(!returned.load(), "a copy into pageable memory returned before the stream's wait passed");
  d->writeFlag(flag, 1, writer.get());
  copier.join();
  CHECK(returned.load() && seen[0] == 7 && seen[63] == 7);
  // From the host: staged, so overwriting the source right after the call is safe.
  char src[64];
  std::memset(src, 3, sizeof(src));
  d->copyFromHost(x, src, 64, waiter.get());
  std::memset(src, 9, sizeof(src));
  d->copyToHost(seen, x, 64, waiter.get());
  CHECK_MSG(seen[0] == 3 && seen[63] == 3, "the device got %d, want the 3 the source held at the call", seen[0]);
  d->release(flag);
  d->release(x);
}

TEST(sim_bad_pointers_and_handles_are_named) {
  auto d = makeSimDevice(options(4));
  char* x = static_cast<char*>(d->allocate(64));
  char host[64] = {};
  CHECK_THROWS(d->copyFromHost(host, host, 8, nullptr), InvalidArgument);  // dst is host memory
  CHECK_THROWS(d->copyToHost(x, x, 8, nullptr), InvalidArgument);          // host_dst is device memory
  CHECK_THROWS(d->fill(x + 60, 8, 0, nullptr), InvalidArgument);           // past the allocation's end
  CHECK_THROWS(d->release(x + 8), InvalidArgument);                        // not a base
  CHECK_THROWS(d->exportMemory(x), InvalidArgument);                       // interprocess mode is off
  auto e = d->newEvent(true);
  CHECK_THROWS(d->exportEvent(*e), InvalidArgument);
  CHECK_THROWS(d->openMemory(IpcMemoryHandle{}), InvalidArgument);  // not a handle
  CHECK_THROWS(cpuDevice().exportMemory(host), CollectiveError);    // the CPU device shares nothing
  CHECK_THROWS(cpuDevice().openEvent(IpcEventHandle{}), CollectiveError);
  try {
    d->copyFromHost(host, host, 8, nullptr);
  } catch (const InvalidArgument& err) {
    CHECK_MSG(std::strstr(err.what(), "sim:0: copyFromHost: dst") != nullptr, "message: %s", err.what());
  }
  d->release(x);
}

TEST(sim_wrapped_stream_is_the_same_queue) {
  auto d = makeSimDevice(options(5));
  auto s = d->newStream();
  auto w = d->wrapStream(s.get());
  auto engine = d->wrapStream(nullptr);
  void* x = d->allocate(4);
  const int32_t one = 1, two = 2;
  int32_t seen = 0;
  d->copyFromHost(x, &one, 4, s.get());
  d->copyFromHost(x, &two, 4, w.get());  // after the first: one queue
  d->copyToHost(&seen, x, 4, s.get());
  finish(*d, w.get());
  CHECK(seen == 2);
  finish(*d, engine.get());
  d->release(x);
}

// The ranks of a job share HVDTORCH_SIM_SEED but not their delays: every
// stream's seed depends on the rank, and on nothing else besides the seed
// and the stream's number (a rerun with the same seed repeats the delays).
TEST(sim_stream_seeds_differ_by_rank) {
  std::vector<uint64_t> seen;
  for (int rank = 0; rank < 4; ++rank) {
    SimOptions o = options(42);
    o.rank = rank;
    for (uint64_t stream = 0; stream < 4; ++stream) {
      const uint64_t seed = simStreamSeed(o, stream);
      for (uint64_t other : seen)
        CHECK_MSG(seed != other, "rank %d stream %llu repeats a seed", rank, static_cast<unsigned long long>(stream));
      seen.push_back(seed);
      CHECK(simStreamSeed(o, stream) == seed);
    }
  }
  SimOptions a = options(42), b = options(43);
  CHECK(simStreamSeed(a, 0) != simStreamSeed(b, 0));
  // fromEnv reports the rank given to setSimRank.
  setSimRank(3);
  CHECK(SimOptions::fromEnv().rank == 3);
  setSimRank(0);
  CHECK(SimOptions::fromEnv().rank == 0);
}

TEST(sim_options_from_environment) {
  setenv("HVDTORCH_SIM_SEED", "1234", 1);
  setenv("HVDTORCH_SIM_MAX_DELAY_US", "0", 1);
  const SimOptions o = SimOptions::fromEnv();
  CHECK(o.seed == 1234 && o.max_delay_us == 0 && !o.interprocess);
  setenv("HVDTORCH_SIM_SEED", "12x", 1);
  CHECK_THROWS(SimOptions::fromEnv(), InvalidArgument);
  unsetenv("HVDTORCH_SIM_SEED");
  unsetenv("HVDTORCH_SIM_MAX_DELAY_US");
}

HVD_TEST_MAIN()
