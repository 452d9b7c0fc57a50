#include "device/sim_device.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"
#include "config/config.h"
#include "device/reduce_kernels.h"

namespace hvdtorch {

namespace {

// ---- options -------------------------------------------------------------------

// An operation's simulated cost beyond its work (SimOptions::host_copy_us,
// kernel_us): the stream's thread sleeps, taking no CPU.
void costs(int microseconds) {
  if (microseconds > 0) std::this_thread::sleep_for(std::chrono::microseconds(microseconds));
}

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// ---- streams: one thread each, running its queue in order ----------------------

// A stream's thread. Operations run in enqueue order, each after a seeded
// random delay; `done` counts finished operations, so "operation number seq
// has run" is done >= seq, and a waiter that observes it (under mu_) sees
// everything the operation wrote.
class Worker {
 public:
  Worker(uint64_t seed, int max_delay_us) : rng_(seed), max_delay_us_(max_delay_us), thread_([this] { run(); }) {}
  ~Worker() { shutdown(); }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Returns the operation's sequence number (1, 2, ...).
  uint64_t enqueue(std::function<void()> fn) {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) throw CollectiveError("sim: operation enqueued on a destroyed stream");
    queue_.push_back(std::move(fn));
    const uint64_t seq = ++enqueued_;
    work_cv_.notify_one();
    return seq;
  }
  void waitDone(uint64_t seq) {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return done_ >= seq; });
  }
  bool isDone(uint64_t seq) {
    std::lock_guard<std::mutex> lk(mu_);
    return done_ >= seq;
  }
  void drain() {
    uint64_t last;
    {
      std::lock_guard<std::mutex> lk(mu_);
      last = enqueued_;
    }
    waitDone(last);
  }
  // Runs what is queued, then joins the thread. Only ever called from a
  // host thread (never from a stream's own thread).
  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      work_cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      if (max_delay_us_ > 0) {
        std::uniform_int_distribution<int> us(0, max_delay_us_);
        std::this_thread::sleep_for(std::chrono::microseconds(us(rng_)));
      }
      fn();
      fn = nullptr;  // what it captured goes before the operation counts as done
      lk.lock();
      ++done_;
      done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0, done_ = 0;
  bool stopping_ = false;
  std::mt19937_64 rng_;  // used by the stream's thread only
  int max_delay_us_;
  std::thread thread_;  // last: starts once everything above is initialised
};

class SimStream : public Stream {
 public:
  SimStream(std::shared_ptr<Worker> w, bool owned) : worker(std::move(w)), owned_(owned) {}
  ~SimStream() override {
    if (owned_) worker->shutdown();  // queued work still runs (CUDA's rule)
  }
  std::shared_ptr<Worker> worker;

 private:
  bool owned_;
};

// ---- events -----------------------------------------------------------------------

class SimEvent : public Event {
 public:
  // Enqueues the record on `w` and makes it the event's most recent record.
  virtual void record(const std::shared_ptr<Worker>& w) = 0;
  // What a stream runs for a wait bound now (to the most recent record).
  virtual std::function<void()> boundWait() = 0;
  virtual bool query() = 0;
  virtual void synchronize() = 0;
};

// An event of this process: its most recent record is (stream, sequence
// number of the record operation on that stream).
class LocalEvent : public SimEvent {
 public:
  void record(const std::shared_ptr<Worker>& w) override {
    std::lock_guard<std::mutex> lk(mu_);
    seq_ = w->enqueue([] {});
    worker_ = w;
  }
  std::function<void()> boundWait() override {
    std::lock_guard<std::mutex> lk(mu_);
    if (!worker_) return [] {};  // never recorded: complete
    return [w = worker_, seq = seq_] { w->waitDone(seq); };
  }
  bool query() override {
    std::lock_guard<std::mutex> lk(mu_);
    return !worker_ || worker_->isDone(seq_);
  }
  void synchronize() override { boundWait()(); }

 private:
  std::mutex mu_;
  std::shared_ptr<Worker> worker_;
  uint64_t seq_ = 0;
};

// ---- shared memory: names, handles ---------------------------------------------------

constexpr uint32_t kMemoryMagic = 0x4d4d4953;  // "SIMM"
constexpr uint32_t kEventMagic = 0x454d4953;   // "SIME"

// The bytes of an IpcMemoryHandle / IpcEventHandle.
struct HandleWire {
  uint32_t magic;
  int32_t pid;    // the exporter
  uint64_t size;  // bytes of the segment
  char name[48];  // shm_open name, NUL-terminated
};
static_assert(sizeof(HandleWire) == 64, "handles are 64 bytes");

template <typename Handle>
Handle encode(uint32_t magic, uint64_t size, const std::string& name) {
  HandleWire w{};
  w.magic = magic;
  w.pid = static_cast<int32_t>(getpid());
  w.size = size;
  std::snprintf(w.name, sizeof(w.name), "%s", name.c_str());
  Handle h;
  std::memcpy(h.bytes, &w, sizeof(w));
  return h;
}

template <typename Handle>
HandleWire decode(const Handle& h, uint32_t magic, const char* what) {
  HandleWire w;
  std::memcpy(&w, h.bytes, sizeof(w));
  if (w.magic != magic || std::memchr(w.name, '\0', sizeof(w.name)) == nullptr)
    throw InvalidArgument(strCat(what, ": not a handle of a simulated device"));
  if (w.pid == getpid())
    throw InvalidArgument(
        strCat(what, ": the handle was exported by this process (", w.name, "); a process cannot open its own handle"));
  return w;
}

std::string nextShmName(char kind) {
  static std::atomic<uint64_t> counter{0};
  return strCat(simShmPrefix(), kind, counter.fetch_add(1));
}

std::atomic<uint64_t> g_released_while_open{0};
std::atomic<int> g_sim_rank{0};  // setSimRank

size_t pageSize() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

size_t pageRounded(size_t bytes) {
  const size_t page = pageSize();
  return (std::max<size_t>(bytes, 1) + page - 1) / page * page;
}

// The state of an interprocess event, in its shared-memory segment.
// `recorded` counts records (incremented by record() on the host), and
// `completed` is the highest record that ran. A wait binds to the value of
// `recorded` at the time of the call. Contract: records of one interprocess
// event complete in the order they were made (record it on one stream at a
// time), as the engine's links do.
struct SharedEventState {
  std::atomic<uint64_t> recorded;
  std::atomic<uint64_t> completed;
  int32_t owner_pid;
};

struct SharedEventMapping {
  SharedEventState* state = nullptr;
  std::string name;
  bool owner = false;
  ~SharedEventMapping() {
    if (state != nullptr) munmap(state, pageRounded(sizeof(SharedEventState)));
    if (owner) shm_unlink(name.c_str());
  }
};

bool processAlive(int32_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

// Polls until record number `target` of the event ran; gives up (false) if
// the process that created the event died with it not done.
bool pollShared(const SharedEventMapping& m, uint64_t target) {
  for (int i = 1;; ++i) {
    if (m.state->completed.load(std::memory_order_acquire) >= target) return true;
    if (i % 5000 == 0 && !processAlive(m.state->owner_pid)) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

class SharedEvent : public SimEvent {
 public:
  explicit SharedEvent(std::shared_ptr<SharedEventMapping> m) : m_(std::move(m)) {}
  void record(const std::shared_ptr<Worker>& w) override {
    const uint64_t gen = m_->state->recorded.fetch_add(1, std::memory_order_acq_rel) + 1;
    w->enqueue([m = m_, gen] {
      uint64_t c = m->state->completed.load(std::memory_order_relaxed);
      while (c < gen && !m->state->completed.compare_exchange_weak(c, gen, std::memory_order_release)) {
      }
    });
  }
  std::function<void()> boundWait() override {
    const uint64_t target = m_->state->recorded.load(std::memory_order_acquire);
    return [m = m_, target] {
      if (!pollShared(*m, target))
        throw CollectiveError(strCat("wait on interprocess event ", m->name, ": its process ", m->state->owner_pid,
                                     " died before the record ran"));
    };
  }
  bool query() override {
    return m_->state->completed.load(std::memory_order_acquire) >= m_->state->recorded.load(std::memory_order_acquire);
  }
  void synchronize() override { boundWait()(); }
  const SharedEventMapping& mapping() const { return *m_; }

 private:
  std::shared_ptr<SharedEventMapping> m_;
};

// ---- the device ----------------------------------------------------------------------

class SimDevice : public Device {
 public:
  explicit SimDevice(const SimOptions& o) : opt_(o) {
    engine_ = std::make_shared<Worker>(simStreamSeed(opt_, 0), opt_.max_delay_us);
    workers_.push_back(engine_);
  }

  ~SimDevice() override {
    // Queued work first (it may touch the memory), then the threads, then the memory.
    drainAll();
    engine_->shutdown();
    for (auto& entry : allocs_) unmap(entry.second);
  }

  bool interprocess() const override { return opt_.interprocess; }
  DeviceId id() const override { return DeviceId{DeviceKind::kSim, opt_.index}; }

  void* allocate(size_t bytes) override {
    // Interprocess: one more page, past the memory, counts the peers' open mappings.
    const size_t mapped = pageRounded(bytes) + (opt_.interprocess ? pageSize() : 0);
    std::string name;
    int fd;
    if (opt_.interprocess) {
      name = nextShmName('m');
      fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    } else {
      fd = memfd_create("hvdtorch-sim", MFD_CLOEXEC);
    }
    if (fd < 0) throw CollectiveError(strCat(where(), "allocate(", bytes, "): ", std::strerror(errno)));
    if (ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
      const int err = errno;
      close(fd);
      if (!name.empty()) shm_unlink(name.c_str());
      throw CollectiveError(strCat(where(), "allocate(", bytes, "): ftruncate: ", std::strerror(err)));
    }
    Allocation a{bytes, mapped, nullptr, nullptr, name, false};
    void* base = mapTwice(fd, a, "allocate");
    std::lock_guard<std::mutex> lk(mu_);
    allocs_.emplace(reinterpret_cast<uintptr_t>(base), a);
    return base;
  }

  void release(void* p) override {
    if (p == nullptr) return;
    Allocation a = take(p, false, "release");
    // Like cudaFree: nothing queued may still use it.
    drainAll();
    if (!a.shm_name.empty()) {
      // CUDA IPC leaves freeing memory a peer still has open undefined: count it.
      const int32_t open = opens(a).load();
      if (open != 0) {
        g_released_while_open.fetch_add(1);
        std::fprintf(stderr, "%srelease(%p): %d peer mapping(s) still open\n", where().c_str(), p, open);
      }
    }
    unmap(a);
  }

  void copy(void* dst, const void* src, size_t bytes, Stream* s) override {
    if (bytes == 0) return;
    char* d = shadow(dst, bytes, "copy", "dst");
    const char* x = shadow(src, bytes, "copy", "src");
    if (d == x) return;
    enqueue(s, "copy", [d, x, bytes] { std::memmove(d, x, bytes); });
  }
  void copyToHost(void* host_dst, const void* src, size_t bytes, Stream* s) override {
    if (bytes == 0) return;
    checkHost(host_dst, bytes, "copyToHost", "host_dst");
    countIfUnpinned(host_dst, bytes, s);
    const char* x = shadow(src, bytes, "copyToHost", "src");
    enqueueHostCopy(s, host_dst, bytes, "copyToHost", [host_dst, x, bytes, us = opt_.host_copy_us] {
      std::memcpy(host_dst, x, bytes);
      costs(us);
    });
  }
  void copyFromHost(void* dst, const void* host_src, size_t bytes, Stream* s) override {
    if (bytes == 0) return;
    checkHost(host_src, bytes, "copyFromHost", "host_src");
    countIfUnpinned(host_src, bytes, s);
    char* d = shadow(dst, bytes, "copyFromHost", "dst");
    if (!isPinned(host_src, bytes)) {
      // CUDA's rule for pageable memory: the host waits for the stream's
      // earlier work, the bytes are staged, and the copy to the device runs
      // later (the caller may reuse its memory at once).
      const std::shared_ptr<Worker> w = worker(s);
      w->drain();
      auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(host_src),
                                                        static_cast<const char*>(host_src) + bytes);
      enqueueOn(w, "copyFromHost", [d, staged, us = opt_.host_copy_us] {
        std::memcpy(d, staged->data(), staged->size());
        costs(us);
      });
      return;
    }
    enqueue(s, "copyFromHost", [d, host_src, bytes, us = opt_.host_copy_us] {
      std::memcpy(d, host_src, bytes);
      costs(us);
    });
  }
  void fill(void* dst, size_t bytes, uint8_t byte, Stream* s) override {
    if (bytes == 0) return;
    char* d = shadow(dst, bytes, "fill", "dst");
    enqueue(s, "fill", [d, bytes, byte] { std::memset(d, byte, bytes); });
  }

  void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op, Stream* s) override {
    if (count == 0) return;
    if (dtype != DataType::kBool && op != ReduceOp::kSum && op != ReduceOp::kMin && op != ReduceOp::kMax &&
        op != ReduceOp::kProduct)
      throw InvalidArgument(strCat("reduceInto: op ", reduceOpName(op), " is not an element-wise reduction"));
    const size_t bytes = count * dtypeSize(dtype);
    char* d = shadow(dst, bytes, "reduceInto", "dst");
    const char* x = shadow(src, bytes, "reduceInto", "src");
    enqueue(s, "reduceInto", [=, us = opt_.kernel_us] {
      hvdtorch::reduceInto(d, x, count, dtype, op);
      costs(us);
    });
  }

  void copyScaled(void* dst, const void* src, size_t count, DataType dtype, double factor, Stream* s) override {
    if (count == 0) return;
    if (dtype == DataType::kBool && factor != 1.0) throw InvalidArgument("scaling is not defined for bool tensors");
    const size_t bytes = count * dtypeSize(dtype);
    char* d = shadow(dst, bytes, "copyScaled", "dst");
    const char* x = shadow(src, bytes, "copyScaled", "src");
    enqueue(s, "copyScaled", [=] { hvdtorch::copyScaled(d, x, count, dtype, factor); });
  }

  void copyAveraged(void* dst, const void* src, size_t count, DataType dtype, int64_t divisor, double factor,
                    Stream* s) override {
    if (divisor <= 0) throw InvalidArgument(strCat("copyAveraged: divisor ", divisor, " is not positive"));
    if (divisor == 1 || isFloating(dtype)) return copyScaled(dst, src, count, dtype, factor / double(divisor), s);
    if (count == 0) return;
    if (dtype == DataType::kBool) throw InvalidArgument("Average is not defined for bool tensors");
    const size_t bytes = count * dtypeSize(dtype);
    char* d = shadow(dst, bytes, "copyAveraged", "dst");
    const char* x = shadow(src, bytes, "copyAveraged", "src");
    enqueue(s, "copyAveraged", [=] { hvdtorch::copyAveraged(d, x, count, dtype, divisor, factor); });
  }

  std::unique_ptr<Stream> newStream() override {
    std::lock_guard<std::mutex> lk(mu_);
    auto w = std::make_shared<Worker>(simStreamSeed(opt_, ++streams_made_), opt_.max_delay_us);
    workers_.erase(std::remove_if(workers_.begin(), workers_.end(), [](auto& x) { return x.expired(); }),
                   workers_.end());
    workers_.push_back(w);
    return std::make_unique<SimStream>(std::move(w), true);
  }
  std::unique_ptr<Stream> wrapStream(void* native) override {
    if (native == nullptr) return std::make_unique<SimStream>(engine_, false);
    auto* s = dynamic_cast<SimStream*>(static_cast<Stream*>(native));
    if (s == nullptr) throw InvalidArgument(strCat(where(), "wrapStream: not a stream of a simulated device"));
    return std::make_unique<SimStream>(s->worker, false);
  }

  std::unique_ptr<Event> newEvent(bool interprocess) override {
    if (!interprocess || !opt_.interprocess) return std::make_unique<LocalEvent>();
    auto m = std::make_shared<SharedEventMapping>();
    m->name = nextShmName('e');
    const int fd = shm_open(m->name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) throw CollectiveError(strCat(where(), "newEvent(interprocess): ", std::strerror(errno)));
    m->owner = true;
    const size_t size = pageRounded(sizeof(SharedEventState));
    void* p = MAP_FAILED;
    if (ftruncate(fd, static_cast<off_t>(size)) == 0)
      p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    close(fd);
    if (p == MAP_FAILED) throw CollectiveError(strCat(where(), "newEvent(interprocess): ", std::strerror(err)));
    m->state = new (p) SharedEventState{{0}, {0}, static_cast<int32_t>(getpid())};
    return std::make_unique<SharedEvent>(std::move(m));
  }

  void record(Event& e, Stream* s) override { asSim(e).record(worker(s)); }
  void wait(Stream* s, Event& e) override { enqueue(s, "wait", asSim(e).boundWait()); }
  bool query(Event& e) override {
    throwSticky();
    return asSim(e).query();
  }
  void synchronize(Event& e) override {
    asSim(e).synchronize();
    throwSticky();
  }

  bool streamFlags() const override { return true; }
  void writeFlag(void* flag, uint32_t value, Stream* s) override {
    char* f = flagShadow(flag, "writeFlag");
    enqueue(s, "writeFlag", [f, value] { __atomic_store_n(reinterpret_cast<uint32_t*>(f), value, __ATOMIC_RELEASE); });
  }
  void waitFlag(const void* flag, uint32_t value, Stream* s) override {
    const char* f = flagShadow(flag, "waitFlag");
    enqueue(s, "waitFlag", [f, flag, value, timeout = opt_.flag_timeout_ms, at = where()] {
      const auto* word = reinterpret_cast<const uint32_t*>(f);
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout);
      for (;;) {
        const uint32_t now = __atomic_load_n(word, __ATOMIC_ACQUIRE);
        if (static_cast<int32_t>(now - value) >= 0) return;
        if (std::chrono::steady_clock::now() > give_up) {
          const std::string why = strCat("the flag at ", flag, " stayed at ", now, " while a stream waited for ", value,
                                         " for ", timeout, " ms: nothing writes that value (on a GPU this hangs)");
          std::fprintf(stderr, "%swaitFlag: %s\n", at.c_str(), why.c_str());
          throw CollectiveError(why);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    });
  }

  IpcMemoryHandle exportMemory(void* base) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = allocs_.find(reinterpret_cast<uintptr_t>(base));
    if (it == allocs_.end() || it->second.opened)
      throw InvalidArgument(
          strCat(where(), "exportMemory: ", base, " is not the base of an allocation of this device"));
    if (it->second.shm_name.empty())
      throw InvalidArgument(strCat(where(), "exportMemory: interprocess mode is off (SimOptions::interprocess)"));
    return encode<IpcMemoryHandle>(kMemoryMagic, it->second.mapped, it->second.shm_name);
  }

  void* openMemory(const IpcMemoryHandle& h) override {
    const HandleWire w = decode(h, kMemoryMagic, "openMemory");
    const int fd = shm_open(w.name, O_RDWR, 0);
    if (fd < 0)
      throw CollectiveError(strCat(where(), "openMemory(", w.name, " of process ", w.pid, "): ", std::strerror(errno)));
    struct stat st{};
    if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < w.size) {
      close(fd);
      throw CollectiveError(strCat(where(), "openMemory(", w.name, "): the segment is smaller than the handle says"));
    }
    Allocation a{w.size, w.size, nullptr, nullptr, std::string(), true};
    void* base = mapTwice(fd, a, "openMemory");
    opens(a).fetch_add(1);
    std::lock_guard<std::mutex> lk(mu_);
    allocs_.emplace(reinterpret_cast<uintptr_t>(base), a);
    return base;
  }

  void closeMemory(void* p) override {
    Allocation a = take(p, true, "closeMemory");
    drainAll();
    opens(a).fetch_sub(1);
    unmap(a);
  }

  IpcEventHandle exportEvent(Event& e) override {
    auto* shared = dynamic_cast<SharedEvent*>(&e);
    if (shared == nullptr)
      throw InvalidArgument(strCat(where(),
                                   "exportEvent: the event was not made by newEvent(true) on a device in "
                                   "interprocess mode"));
    return encode<IpcEventHandle>(kEventMagic, sizeof(SharedEventState), shared->mapping().name);
  }

  std::unique_ptr<Event> openEvent(const IpcEventHandle& h) override {
    const HandleWire w = decode(h, kEventMagic, "openEvent");
    const int fd = shm_open(w.name, O_RDWR, 0);
    if (fd < 0)
      throw CollectiveError(strCat(where(), "openEvent(", w.name, " of process ", w.pid, "): ", std::strerror(errno)));
    void* p = mmap(nullptr, pageRounded(sizeof(SharedEventState)), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    close(fd);
    if (p == MAP_FAILED) throw CollectiveError(strCat(where(), "openEvent(", w.name, "): ", std::strerror(err)));
    auto m = std::make_shared<SharedEventMapping>();
    m->state = static_cast<SharedEventState*>(p);
    m->name = w.name;
    return std::make_unique<SharedEvent>(std::move(m));
  }

  void registerHost(void* host, size_t bytes) override {
    if (host == nullptr || bytes == 0) return;
    checkHost(host, bytes, "registerHost", "host");
    std::lock_guard<std::mutex> lk(mu_);
    if (!pinned_.emplace(reinterpret_cast<uintptr_t>(host), bytes).second)
      throw InvalidArgument(strCat(where(), "registerHost: ", host, " is already registered"));
  }
  void unregisterHost(void* host) override {
    if (host == nullptr) return;
    std::lock_guard<std::mutex> lk(mu_);
    if (pinned_.erase(reinterpret_cast<uintptr_t>(host)) == 0)
      throw InvalidArgument(strCat(where(), "unregisterHost: ", host, " was never registered"));
  }

  uint64_t unpinnedEngineCopies() const { return unpinned_engine_copies_.load(); }
  const SimOptions& options() const { return opt_; }
  void stall(Stream* s, int milliseconds) {
    enqueue(s, "stall", [milliseconds] { std::this_thread::sleep_for(std::chrono::milliseconds(milliseconds)); });
  }

 private:
  struct Allocation {
    size_t size;           // what was asked for (bounds checks)
    size_t mapped;         // page-rounded length of both mappings
    char* dev;             // the PROT_NONE mapping: the device pointer
    char* rw;              // the mapping the stream threads use
    std::string shm_name;  // a segment this process created (unlinked on release)
    bool opened;           // from openMemory: closeMemory, never release
  };

  std::string where() const { return id().str() + ": "; }

  // The open count in the last page of an interprocess allocation's segment
  // (the same offset from both the creator's and an opener's mapping).
  static std::atomic<int32_t>& opens(const Allocation& a) {
    static_assert(std::atomic<int32_t>::is_always_lock_free, "shared between processes");
    return *reinterpret_cast<std::atomic<int32_t>*>(a.rw + a.mapped - pageSize());
  }

  void* mapTwice(int fd, Allocation& a, const char* what) {
    void* dev = mmap(nullptr, a.mapped, PROT_NONE, MAP_SHARED, fd, 0);
    void* rw = dev == MAP_FAILED ? MAP_FAILED : mmap(nullptr, a.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    close(fd);
    if (rw == MAP_FAILED) {
      if (dev != MAP_FAILED) munmap(dev, a.mapped);
      if (!a.shm_name.empty()) shm_unlink(a.shm_name.c_str());
      throw CollectiveError(strCat(where(), what, ": mmap: ", std::strerror(err)));
    }
    a.rw = static_cast<char*>(rw);
    a.dev = static_cast<char*>(dev);
    return dev;
  }

  static void unmap(const Allocation& a) {
    munmap(a.dev, a.mapped);
    munmap(a.rw, a.mapped);
    if (!a.shm_name.empty()) shm_unlink(a.shm_name.c_str());
  }

  Allocation take(void* p, bool opened, const char* what) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = allocs_.find(reinterpret_cast<uintptr_t>(p));
    if (it == allocs_.end() || it->second.opened != opened)
      throw InvalidArgument(strCat(where(), what, ": ", p, " is not ",
                                   opened ? "memory opened by openMemory" : "the base of an allocation",
                                   " of this device"));
    Allocation a = it->second;
    allocs_.erase(it);
    return a;
  }

  // The read-write address of device memory [p, p + bytes), which must lie in one allocation.
  char* shadow(const void* p, size_t bytes, const char* op, const char* arg) {
    const auto addr = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lk(mu_);
    auto it = allocs_.upper_bound(addr);
    if (it != allocs_.begin()) {
      --it;
      const uintptr_t off = addr - it->first;
      if (addr >= it->first && off <= it->second.size && bytes <= it->second.size - off) return it->second.rw + off;
    }
    throw InvalidArgument(
        strCat(where(), op, ": ", arg, " = ", p, " (", bytes, " bytes) is not inside one allocation of this device"));
  }

  char* flagShadow(const void* flag, const char* op) {
    if (reinterpret_cast<uintptr_t>(flag) % alignof(uint32_t) != 0)
      throw InvalidArgument(strCat(where(), op, ": flag = ", flag, " is not 4-byte aligned"));
    return shadow(flag, sizeof(uint32_t), op, "flag");
  }

  // Host memory handed to a copy must not be device memory.
  void checkHost(const void* p, size_t bytes, const char* op, const char* arg) {
    const auto addr = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lk(mu_);
    auto it = allocs_.upper_bound(addr + bytes - 1);
    if (it == allocs_.begin()) return;
    --it;
    if (it->first + it->second.mapped > addr)
      throw InvalidArgument(strCat(where(), op, ": ", arg, " = ", p, " is device memory, not host memory"));
  }

  // Copies on the engine stream (s == nullptr) from or to host memory that
  // was not registered: on a GPU each would be a synchronous copy, so the
  // engine's staging must never make one (tests read the count).
  void countIfUnpinned(const void* host, size_t bytes, Stream* s) {
    if (s == nullptr && !isPinned(host, bytes)) ++unpinned_engine_copies_;
  }

  std::shared_ptr<Worker> worker(Stream* s) {
    if (s == nullptr) return engine_;
    auto* sim = dynamic_cast<SimStream*>(s);
    if (sim == nullptr) throw InvalidArgument(strCat(where(), "not a stream of a simulated device"));
    return sim->worker;
  }

  static SimEvent& asSim(Event& e) {
    auto* sim = dynamic_cast<SimEvent*>(&e);
    if (sim == nullptr) throw InvalidArgument("sim: not an event of a simulated device");
    return *sim;
  }

  // An operation's failure on a stream thread is kept (the first one) and
  // thrown by the next query() or synchronize(), as CUDA's errors are.
  void enqueue(Stream* s, const char* what, std::function<void()> fn) { enqueueOn(worker(s), what, std::move(fn)); }
  uint64_t enqueueOn(const std::shared_ptr<Worker>& w, const char* what, std::function<void()> fn) {
    return w->enqueue([this, what, fn = std::move(fn)] {
      try {
        fn();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lk(error_mu_);
        if (error_.empty()) error_ = strCat(where(), what, ": ", e.what());
      }
    });
  }
  // A copy into host memory that is not registered (pageable, on a GPU)
  // returns only once it ran, as CUDA's does: the host waits for the
  // stream's earlier work, including waits on events and flags.
  void enqueueHostCopy(Stream* s, const void* host, size_t bytes, const char* what, std::function<void()> fn) {
    const std::shared_ptr<Worker> w = worker(s);
    const uint64_t seq = enqueueOn(w, what, std::move(fn));
    if (!isPinned(host, bytes)) w->waitDone(seq);
  }
  bool isPinned(const void* host, size_t bytes) {
    const auto addr = reinterpret_cast<uintptr_t>(host);
    std::lock_guard<std::mutex> lk(mu_);
    auto it = pinned_.upper_bound(addr);
    if (it == pinned_.begin()) return false;
    --it;
    return addr - it->first <= it->second && bytes <= it->second - (addr - it->first);
  }

  void throwSticky() {
    std::lock_guard<std::mutex> lk(error_mu_);
    if (!error_.empty()) throw CollectiveError(error_);
  }

  void drainAll() {
    std::vector<std::shared_ptr<Worker>> live;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& w : workers_)
        if (auto x = w.lock()) live.push_back(std::move(x));
    }
    for (auto& w : live) w->drain();
  }

  const SimOptions opt_;
  std::shared_ptr<Worker> engine_;
  std::mutex mu_;  // allocs_, workers_, streams_made_
  std::map<uintptr_t, Allocation> allocs_;
  std::map<uintptr_t, size_t> pinned_;  // registerHost: base -> bytes
  std::atomic<uint64_t> unpinned_engine_copies_{0};
  std::vector<std::weak_ptr<Worker>> workers_;
  uint64_t streams_made_ = 0;
  std::mutex error_mu_;
  std::string error_;
};

}  // namespace

SimOptions SimOptions::fromEnv() {
  const Config c = Config::loadFromEnvironment(
      {"SIM_SEED", "SIM_MAX_DELAY_US", "SIM_INTERPROCESS", "SIM_HOST_COPY_US", "SIM_KERNEL_US"});
  SimOptions o;
  o.seed = c.sim_seed;
  o.max_delay_us = c.sim_max_delay_us;
  o.interprocess = c.sim_interprocess;
  o.host_copy_us = c.sim_host_copy_us;
  o.kernel_us = c.sim_kernel_us;
  o.rank = g_sim_rank.load();
  return o;
}

void setSimRank(int rank) { g_sim_rank.store(rank); }

uint64_t simStreamSeed(const SimOptions& options, uint64_t stream) {
  const uint64_t rank = static_cast<uint64_t>(options.rank);
  return splitmix((splitmix(options.seed) ^ splitmix(~rank)) + stream);
}

uint64_t simUnpinnedEngineCopies(Device& device) {
  auto* sim = dynamic_cast<SimDevice*>(&device);
  if (sim == nullptr) throw InvalidArgument(strCat(device.id().str(), " is not a simulated device"));
  return sim->unpinnedEngineCopies();
}

SimOptions simDeviceOptions(Device& device) {
  auto* sim = dynamic_cast<SimDevice*>(&device);
  if (sim == nullptr) throw InvalidArgument(strCat(device.id().str(), " is not a simulated device"));
  return sim->options();
}

void simStall(Device& device, Stream* stream, int milliseconds) {
  auto* sim = dynamic_cast<SimDevice*>(&device);
  if (sim == nullptr) throw InvalidArgument(strCat(device.id().str(), " is not a simulated device"));
  sim->stall(stream, milliseconds);
}

uint64_t simReleasedWhileOpen() { return g_released_while_open.load(); }

std::unique_ptr<Device> makeSimDevice(const SimOptions& options) { return std::make_unique<SimDevice>(options); }

std::string simShmPrefix() { return strCat("/hvdtorch-sim-", getpid(), "-"); }

}  // namespace hvdtorch
