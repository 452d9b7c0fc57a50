#include "transport/shm/link.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/thread_placement.h"
#include "transport/shm/ring.h"
#include "transport/shm/segment.h"
#include "transport/shm/wait.h"

namespace hvdtorch {

namespace {

constexpr size_t kFrame = sizeof(uint64_t);  // length prefix of every message

size_t roundUp64(size_t n) { return (n + 63) / 64 * 64; }

// User region of the pair's segment:
//   [ctl lower->higher][ctl higher->lower][data lower->higher][data higher->lower]
size_t segmentBytes(size_t ring) { return 2 * sizeof(ShmRingCtl) + 2 * roundUp64(ring); }

// At most a quarter of the ring per publish, so the consumer starts copying
// out while the producer fills the rest; 256 KiB keeps the number of
// notifications per large message small.
size_t pieceFor(size_t ring) { return std::max<size_t>(1, std::min<size_t>(ring / 4, size_t(256) << 10)); }

// Ownership of the streaming fields (pos, staged, is_staged): whoever holds
// the op — the poster or a waiter under State::mu while the op is not being
// streamed, or the sender thread while `State::pumping` points to it.
struct SendOp {
  const char* src;  // the caller's buffer, read until `released`
  size_t bytes;
  uint64_t frame;
  // Stream bytes (frame + payload) in the ring; atomic so that a timed-out
  // waiter can report progress.
  std::atomic<size_t> pos{0};
  // The unsent tail of the payload, copied when the caller waited before the
  // peer had taken everything (see "Completion" in the header).
  std::vector<char> staged;
  size_t staged_from = 0;  // payload offset of staged[0]
  bool is_staged = false;
  std::atomic<bool> stage_requested{false};  // a waiter asks the sender thread to stage
  // Under State::mu.
  bool released = false;  // the caller's buffer is no longer read (done or staged)
  bool done = false;      // every byte is in the ring
  std::string error;

  size_t total() const { return kFrame + bytes; }
  const char* payload(size_t off) const { return is_staged ? staged.data() + (off - staged_from) : src + off; }
  void stage() {
    if (is_staged) return;
    const size_t p = pos.load(std::memory_order_relaxed);
    staged_from = p > kFrame ? p - kFrame : 0;
    staged.assign(src + staged_from, src + bytes);
    is_staged = true;
  }
};

struct RecvOp {
  char* dst;
  size_t bytes;
  uint64_t frame = 0;
  size_t pos = 0;  // stream bytes taken out of the ring
  bool done = false;
  std::string error;
  size_t total() const { return kFrame + bytes; }
};

}  // namespace

std::string shmLinkName(const std::string& prefix, int a, int b) {
  return strCat(prefix, "-l", std::min(a, b), "-", std::max(a, b));
}

// Everything a link owns, shared with its outstanding requests so that a
// request outliving its link (allowed by the Link contract) never dangles.
//
// Threads: the receive side is touched only by the thread using the link.
// The send queue is shared with the sender thread and guarded by `mu`; the
// ring's producer end belongs to whoever holds the front send: the poster
// (only while the queue is empty, under `mu`) or the sender thread.
struct ShmLink::State {
  int self = 0;
  int peer = 0;
  int peer_party = 0;
  ShmSegment seg;
  ShmRing out;
  ShmRing in;

  std::mutex mu;
  std::condition_variable work_cv;            // the sender thread: work queued or stop
  std::condition_variable done_cv;            // send waiters: an op finished or failed
  std::deque<std::shared_ptr<SendOp>> sends;  // unfinished, in posting order
  SendOp* pumping = nullptr;                  // the op the sender thread holds (not under mu while streaming)
  bool stop = false;
  std::string send_broken;             // once set, every pending and later send fails with it
  std::atomic<bool> interrupt{false};  // stop or send_broken, readable without mu
  std::thread sender;
  std::atomic<bool> peer_attached{false};
  std::chrono::milliseconds flush_timeout{0};

  std::deque<std::shared_ptr<RecvOp>> recvs;  // unfinished, in posting order
  std::string recv_broken;

  bool peerAttached() {
    if (peer_attached.load(std::memory_order_acquire)) return true;
    if (!seg.allAttached()) return false;
    peer_attached.store(true, std::memory_order_release);
    return true;
  }

  // The probe of every wait: why the peer will never make progress, if so.
  std::string peerGone() const {
    switch (seg.peer(peer_party)) {
      case ShmSegment::Peer::kDead:
        return strCat("rank ", self, ": peer rank ", peer, " (pid ", seg.pidOf(peer_party), ") died");
      case ShmSegment::Peer::kDetached:
        return strCat("rank ", self, ": peer rank ", peer, " closed its shared-memory link (segment ", seg.name(), ")");
      default: return "";
    }
  }

  // Copies as much of `op` into the ring as fits now. True once all of it is in.
  bool pushSome(SendOp& op) {
    size_t pos = op.pos.load(std::memory_order_relaxed);
    while (pos < op.total()) {
      const size_t n = pos < kFrame ? out.write(reinterpret_cast<const char*>(&op.frame) + pos, kFrame - pos)
                                    : out.write(op.payload(pos - kFrame), op.total() - pos);
      if (n == 0) break;
      pos += n;
    }
    op.pos.store(pos, std::memory_order_relaxed);
    return pos == op.total();
  }

  // Fails every queued send except the one the sender thread is streaming
  // (it notices `interrupt` and fails that one itself). Caller holds mu.
  void breakSends(const std::string& why) {
    if (send_broken.empty()) send_broken = why;
    interrupt.store(true, std::memory_order_release);
    for (auto it = sends.begin(); it != sends.end();) {
      if (it->get() == pumping) {
        ++it;
        continue;
      }
      (*it)->error = send_broken;
      it = sends.erase(it);
    }
    done_cv.notify_all();
    out.spaceSignal().notify();  // wake the sender thread if it sleeps on a full ring
  }

  void breakRecvs(const std::string& why) {
    if (recv_broken.empty()) recv_broken = why;
    for (auto& op : recvs) op->error = recv_broken;
    recvs.clear();
  }

  // Streams `op` to the end, sleeping while the ring is full, and stages it
  // when its waiter asks. Returns an empty string when done, otherwise why
  // it stopped.
  std::string streamOne(SendOp& op) {
    for (;;) {
      if (op.stage_requested.load(std::memory_order_acquire) && !op.is_staged) {
        op.stage();  // this thread holds the op: copy without the lock
        std::lock_guard<std::mutex> lock(mu);
        op.released = true;
        done_cv.notify_all();
      }
      const bool all_in = pushSome(op);
      if (all_in && peerAttached()) return "";
      if (interrupt.load(std::memory_order_acquire)) return "interrupted";
      try {
        // No deadline here: the thread waiting on the request owns it and
        // reports the timeout; this loop ends on stop, on a broken link or
        // when the peer is found gone.
        shmWait(
            out.spaceSignal(), Deadline::never(),
            [&] {
              return interrupt.load(std::memory_order_acquire) ||
                     (op.stage_requested.load(std::memory_order_acquire) && !op.is_staged) ||
                     (all_in ? peerAttached() : out.freeBytes() > 0);
            },
            [&] { return peerGone(); }, [](std::chrono::milliseconds) { return std::string(); });
      } catch (const std::exception& e) {
        return e.what();
      }
    }
  }

  void senderLoop() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      work_cv.wait(lock, [&] { return stop || !sends.empty(); });
      if (stop) return;
      std::shared_ptr<SendOp> op = sends.front();
      pumping = op.get();
      lock.unlock();
      const std::string result = streamOne(*op);
      lock.lock();
      pumping = nullptr;
      if (result.empty()) {
        op->done = true;
        op->released = true;
      } else {
        if (send_broken.empty()) send_broken = result != "interrupted" ? result : closedMessage();
        op->error = send_broken;
      }
      if (!sends.empty() && sends.front() == op) sends.pop_front();
      if (!send_broken.empty()) breakSends(send_broken);
      done_cv.notify_all();
    }
  }

  // Takes whatever has arrived into the posted receives, in order. Never
  // blocks; a framing error breaks the receive side (reported by wait()).
  void progressRecvs() {
    while (!recvs.empty()) {
      RecvOp& op = *recvs.front();
      while (op.pos < op.total()) {
        size_t n;
        if (op.pos < kFrame) {
          n = in.read(reinterpret_cast<char*>(&op.frame) + op.pos, kFrame - op.pos);
          if (n > 0 && op.pos + n == kFrame && op.frame != op.bytes) {
            op.pos += n;
            breakRecvs(strCat("rank ", self, ": message from rank ", peer, " has ", op.frame, " bytes, expected ",
                              op.bytes, " (shared-memory link; the ranks issued mismatched operations)"));
            return;
          }
        } else {
          n = in.read(op.dst + (op.pos - kFrame), op.total() - op.pos);
        }
        if (n == 0) return;  // nothing more has arrived
        op.pos += n;
      }
      op.done = true;
      recvs.pop_front();
    }
  }

  std::string closedMessage() const {
    return strCat("rank ", self, ": shared-memory link to rank ", peer, " was closed");
  }

  // Sends whose callers were told "complete" (released) are still owed to
  // the peer: deliver them before closing, unless the peer is gone (the
  // sender thread then fails them) or `flush_timeout` passes.
  void flush() {
    std::unique_lock<std::mutex> lock(mu);
    const Deadline deadline = Deadline::after(flush_timeout);
    auto owed = [&] { return std::any_of(sends.begin(), sends.end(), [](const auto& op) { return op->released; }); };
    while (owed() && !deadline.expired())
      done_cv.wait_for(lock, std::min<std::chrono::milliseconds>(deadline.remaining(), std::chrono::milliseconds(100)));
  }

  void close(bool deliver) {
    if (deliver) flush();
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
      interrupt.store(true, std::memory_order_release);
    }
    work_cv.notify_all();
    out.spaceSignal().notify();
    if (sender.joinable()) sender.join();
    const std::string why = closedMessage();
    {
      std::lock_guard<std::mutex> lock(mu);
      breakSends(why);
    }
    breakRecvs(why);
    seg.detach();  // the peer's waits fail fast from now on
  }
};

namespace {

class ShmSendRequest : public LinkRequest {
 public:
  ShmSendRequest(std::shared_ptr<ShmLink::State> s, std::shared_ptr<SendOp> op)
      : s_(std::move(s)), op_(std::move(op)) {}

  // Returns once the caller's buffer is free: every byte is in the ring, or
  // the rest has been staged (copied) for the sender thread to deliver. So a
  // send waits only for the peer to attach (bounded by the deadline), never
  // for the peer's application.
  void wait(Deadline deadline) override {
    ShmLink::State& s = *s_;
    std::unique_lock<std::mutex> lock(s.mu);
    for (;;) {
      if (!op_->error.empty()) throw CollectiveError(op_->error);
      if (op_->released) return;
      if (s.peerAttached()) {
        if (s.pumping != op_.get()) {
          op_->stage();  // queued: nobody streams it while we hold mu
          op_->released = true;
          return;
        }
        // The sender thread holds it and stages it at its next step: it
        // never blocks without watching this flag, so this wait is short.
        if (!op_->stage_requested.exchange(true)) s.out.spaceSignal().notify();
        s.done_cv.wait_for(lock, std::chrono::milliseconds(100));
        continue;
      }
      if (deadline.expired()) throw TimeoutError(describe());
      // Attachment is polled: the peer cannot signal this condition variable.
      s.done_cv.wait_for(lock, std::min<std::chrono::milliseconds>(deadline.remaining(), std::chrono::milliseconds(1)));
    }
  }

  // Destroyed while the caller's buffer is still in use: the stream can no
  // longer match the peer's receives, so the send side is broken, and the
  // sender thread must let go of this buffer before it may be freed.
  ~ShmSendRequest() override {
    std::unique_lock<std::mutex> lock(s_->mu);
    if (op_->released || !op_->error.empty()) return;
    s_->breakSends(strCat("rank ", s_->self, ": a send to rank ", s_->peer,
                          " was abandoned before completing; the shared-memory link is unusable"));
    s_->done_cv.wait(lock, [&] { return s_->pumping != op_.get(); });
  }

 private:
  std::string describe() const {
    return strCat("rank ", s_->self, ": timed out sending ", op_->bytes, " bytes to rank ", s_->peer,
                  " over shared memory: rank ", s_->peer, " never attached to segment ", s_->seg.name());
  }

  std::shared_ptr<ShmLink::State> s_;
  std::shared_ptr<SendOp> op_;
};

class ShmRecvRequest : public LinkRequest {
 public:
  ShmRecvRequest(std::shared_ptr<ShmLink::State> s, std::shared_ptr<RecvOp> op)
      : s_(std::move(s)), op_(std::move(op)) {}

  void wait(Deadline deadline) override {
    ShmLink::State& s = *s_;
    for (;;) {
      s.progressRecvs();
      if (op_->done) return;
      if (!op_->error.empty()) throw CollectiveError(op_->error);
      shmWait(
          s.in.dataSignal(), deadline, [&] { return s.in.available() > 0; }, [&] { return s.peerGone(); },
          [&](std::chrono::milliseconds waited) {
            return strCat("rank ", s.self, ": timed out after ", waited.count(), " ms waiting for rank ", s.peer,
                          " to send ", op_->bytes, " bytes over shared memory (",
                          op_->pos > kFrame ? op_->pos - kFrame : 0, " received; segment ", s.seg.name(),
                          s.peerAttached() ? ")" : strCat("; rank ", s.peer, " never attached)"));
          });
    }
  }

  ~ShmRecvRequest() override {
    if (op_->done || !op_->error.empty()) return;
    s_->breakRecvs(strCat("rank ", s_->self, ": a receive from rank ", s_->peer,
                          " was abandoned before completing; the shared-memory link is unusable"));
  }

 private:
  std::shared_ptr<ShmLink::State> s_;
  std::shared_ptr<RecvOp> op_;
};

}  // namespace

ShmLink::ShmLink(const ShmLinkConfig& cfg, int self, int peer) : state_(std::make_shared<State>()) {
  if (self == peer || self < 0 || peer < 0)
    throw InvalidArgument(strCat("rank ", self, ": no shared-memory link to rank ", peer));
  if (cfg.ring_bytes == 0) throw InvalidArgument("shared-memory ring size must be positive");
  State& s = *state_;
  s.self = self;
  s.peer = peer;
  s.flush_timeout = cfg.timeout;
  const bool lower = self < peer;
  s.peer_party = lower ? 1 : 0;
  const std::string name = shmLinkName(cfg.prefix, self, peer);
  const size_t bytes = segmentBytes(cfg.ring_bytes);
  s.seg = lower ? ShmSegment::create(name, bytes, 2, self)
                : ShmSegment::open(name, bytes, 2, 1, self, peer, Deadline::after(cfg.timeout));

  char* base = static_cast<char*>(s.seg.data());
  auto* ctl = reinterpret_cast<ShmRingCtl*>(base);  // [0]: lower->higher, [1]: higher->lower
  char* data = base + 2 * sizeof(ShmRingCtl);
  const size_t stride = roundUp64(cfg.ring_bytes);
  const size_t piece = pieceFor(cfg.ring_bytes);
  ShmRing low_to_high(&ctl[0], data, cfg.ring_bytes, piece, name, 0);
  ShmRing high_to_low(&ctl[1], data + stride, cfg.ring_bytes, piece, name, sizeof(ShmRingCtl));
  s.out = lower ? low_to_high : high_to_low;
  s.in = lower ? high_to_low : low_to_high;
}

// While an exception unwinds (a collective failed), closing promptly matters
// more than delivering: the peers fail fast on seeing this end leave.
ShmLink::~ShmLink() { state_->close(/*deliver=*/std::uncaught_exceptions() == 0); }

int ShmLink::peer() const { return state_->peer; }

std::unique_ptr<LinkRequest> ShmLink::isend(const void* data, size_t bytes) {
  State& s = *state_;
  auto op = std::make_shared<SendOp>();
  op->src = static_cast<const char*>(data);
  op->bytes = bytes;
  op->frame = bytes;
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.send_broken.empty()) {
    op->error = s.send_broken;
  } else if (s.sends.empty() && s.pushSome(*op) && s.peerAttached()) {
    op->done = true;  // the common small-message case: no thread involved
    op->released = true;
  } else {
    // Partly or not at all in the ring: the sender thread takes it from here.
    s.sends.push_back(op);
    if (!s.sender.joinable())
      s.sender = std::thread([&s] {
        placeEngineThread("hvd-shm-send");
        s.senderLoop();
      });
    s.work_cv.notify_one();
  }
  return std::make_unique<ShmSendRequest>(state_, std::move(op));
}

std::unique_ptr<LinkRequest> ShmLink::irecv(void* data, size_t bytes) {
  State& s = *state_;
  auto op = std::make_shared<RecvOp>();
  op->dst = static_cast<char*>(data);
  op->bytes = bytes;
  if (!s.recv_broken.empty()) {
    op->error = s.recv_broken;
  } else {
    s.recvs.push_back(op);
    s.progressRecvs();  // take what is already there; frees ring space early
  }
  return std::make_unique<ShmRecvRequest>(state_, std::move(op));
}

std::unique_ptr<Link> makeShmLink(const ShmLinkConfig& cfg, int self, int peer) {
  return std::make_unique<ShmLink>(cfg, self, peer);
}

}  // namespace hvdtorch
