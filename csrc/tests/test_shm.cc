// The shared-memory transport: ShmSegment lifetime and cleanup, ShmLink
// framing, streaming, ordering, deadlines and dead-peer detection. "Ranks"
// are threads (each with its own mapping) or, where real process death
// matters, fork()ed children. Every name carries this process's pid, and the
// last test checks that nothing is left in /dev/shm.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/ring_allreduce.h"
#include "check.h"
#include "common/error.h"
#include "ranks.h"
#include "shm_entries.h"
#include "transport/shm/link.h"
#include "transport/shm/segment.h"

using namespace hvdtorch;
using hvdtorch::test::runRanks;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

std::string prefixFor(const std::string& tag) { return hvdtorch::test::testShmPrefix() + tag; }

using hvdtorch::test::shmEntries;

bool exists(const std::string& name) {
  for (const std::string& e : shmEntries(name))
    if (e == name) return true;
  return false;
}

long msSince(Clock::time_point t) {
  return static_cast<long>(std::chrono::duration_cast<milliseconds>(Clock::now() - t).count());
}

// Byte i of message m sent by rank r.
unsigned char pattern(int r, int m, size_t i) { return static_cast<unsigned char>(r * 131 + m * 17 + i * 7); }

std::vector<unsigned char> message(int r, int m, size_t n) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = pattern(r, m, i);
  return v;
}

bool matches(const std::vector<unsigned char>& v, int r, int m) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != pattern(r, m, i)) return false;
  return true;
}

ShmLinkConfig config(const std::string& tag, size_t ring_bytes, milliseconds timeout = milliseconds(20000)) {
  ShmLinkConfig cfg;
  cfg.prefix = prefixFor(tag);
  cfg.ring_bytes = ring_bytes;
  cfg.timeout = timeout;
  return cfg;
}

// Runs f(rank) for ranks 0 and 1 on two threads; returns the exceptions' texts.
template <typename F>
std::vector<std::string> pair(F f) {
  std::vector<std::string> errors(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r) {
    ts.emplace_back([&, r] {
      try {
        f(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  return errors;
}

}  // namespace

// ---- ShmSegment ---------------------------------------------------------------

TEST(segment_unlinked_once_all_attached) {
  const std::string name = prefixFor("seg-all");
  ShmSegment a = ShmSegment::create(name, 1000, 3, 0);
  CHECK(exists(name));
  CHECK(a.bytes() == 1000 && a.parties() == 3 && a.party() == 0);
  CHECK(static_cast<unsigned char*>(a.data())[999] == 0);  // zero-filled
  static_cast<char*>(a.data())[5] = 42;
  ShmSegment b = ShmSegment::open(name, 1000, 3, 1, 1, 0, Deadline::after(milliseconds(1000)));
  CHECK(exists(name));  // party 2 has not come yet
  CHECK(!a.allAttached());
  ShmSegment c = ShmSegment::open(name, 1000, 3, 2, 2, 0, Deadline::after(milliseconds(1000)));
  CHECK(!exists(name));                          // the last registration removed the name...
  CHECK(static_cast<char*>(c.data())[5] == 42);  // ...and the memory is shared
  CHECK(a.allAttached() && c.allAttached());
  CHECK(a.peer(1) == ShmSegment::Peer::kAlive && a.pidOf(2) == getpid());
  b = ShmSegment();  // party 1 leaves
  CHECK(a.peer(1) == ShmSegment::Peer::kDetached);
  CHECK(c.peer(0) == ShmSegment::Peer::kAlive);
}

TEST(segment_creator_alone_unlinks_on_destruction) {
  const std::string name = prefixFor("seg-alone");
  {
    ShmSegment a = ShmSegment::create(name, 64, 2, 0);
    CHECK(exists(name));
    CHECK(a.peer(1) == ShmSegment::Peer::kAbsent);
  }
  CHECK(!exists(name));
}

TEST(segment_open_missing_times_out) {
  const std::string name = prefixFor("seg-missing");
  const milliseconds deadline(200);
  const auto t0 = Clock::now();
  std::string what;
  try {
    ShmSegment::open(name, 64, 2, 1, 5, 4, Deadline::after(deadline));
  } catch (const TimeoutError& e) {
    what = e.what();
  }
  const long ms = msSince(t0);
  CHECK_MSG(what.find("rank 5") != std::string::npos && what.find("rank 4") != std::string::npos &&
                what.find(name) != std::string::npos,
            "message: %s", what.c_str());
  // Waited out the deadline, and then stopped (generous margin for a loaded machine).
  CHECK_MSG(ms >= deadline.count() && ms < deadline.count() + 2800, "took %ld ms (deadline %ld ms)", ms,
            long(deadline.count()));
}

TEST(segment_rejects_bad_names_sizes_and_duplicates) {
  CHECK_THROWS(ShmSegment::create("no-slash", 64, 2, 0), InvalidArgument);
  CHECK_THROWS(ShmSegment::create("/a/b", 64, 2, 0), InvalidArgument);
  CHECK_THROWS(ShmSegment::create("/" + std::string(300, 'x'), 64, 2, 0), InvalidArgument);
  const std::string name = prefixFor("seg-dup");
  ShmSegment a = ShmSegment::create(name, 64, 3, 0);
  std::string what;
  try {
    ShmSegment::create(name, 64, 3, 0);  // the creator (this process) is alive: not stale
  } catch (const CollectiveError& e) {
    what = e.what();
  }
  CHECK_MSG(what.find("alive") != std::string::npos, "message: %s", what.c_str());
  CHECK_THROWS(ShmSegment::open(name, 128, 3, 1, 1, 0, Deadline::after(milliseconds(500))), CollectiveError);
  const std::string prefix = makeShmPrefix("run id/with:odd chars" + std::string(200, 'z'));
  ShmSegment::checkName(prefix + "-l12-13");  // throws if invalid
  CHECK(prefix.rfind("/hvdtorch-", 0) == 0 && prefix.size() < 100);
}

TEST(segment_left_by_dead_creator_is_removed) {
  const std::string stale_open = prefixFor("seg-stale-open");
  const std::string stale_create = prefixFor("seg-stale-create");
  const pid_t child = fork();
  if (child == 0) {
    // Create both and die without running destructors, like kill -9.
    ShmSegment* a = new ShmSegment(ShmSegment::create(stale_open, 64, 2, 0));
    ShmSegment* b = new ShmSegment(ShmSegment::create(stale_create, 64, 2, 0));
    (void)a;
    (void)b;
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(exists(stale_open) && exists(stale_create));
  std::string what;
  try {
    ShmSegment::open(stale_open, 64, 2, 1, 1, 0, Deadline::after(milliseconds(1000)));
  } catch (const CollectiveError& e) {
    what = e.what();
  }
  CHECK_MSG(what.find("died") != std::string::npos, "message: %s", what.c_str());
  CHECK(!exists(stale_open));
  {
    ShmSegment fresh = ShmSegment::create(stale_create, 64, 2, 0);  // replaces the leftover
    CHECK(fresh.peer(0) == ShmSegment::Peer::kAlive);
  }
  CHECK(!exists(stale_create));
}

// A creator that never destroys its segment (memory still held when the
// program ends) removes the name when it exits or is terminated by SIGTERM;
// what a SIGKILLed creator leaves is removed by removeDeadJobSegments(),
// which leaves a live creator's segment alone.
TEST(segment_names_of_an_exiting_terminated_or_killed_creator_are_removed) {
  const std::string exiting = prefixFor("seg-exit");
  const std::string terminated = prefixFor("seg-term");
  const std::string killed = strCat("/hvdtorch-test", getpid(), "-seg-kill");
  const std::string live = strCat("/hvdtorch-test", getpid(), "-seg-live");
  auto leakInChild = [](const std::string& name, int signal_self) {
    int ready[2];
    CHECK(pipe(ready) == 0);
    const pid_t child = fork();
    if (child == 0) {
      new ShmSegment(ShmSegment::create(name, 64, 2, 0));  // never destroyed
      const char c = 1;
      (void)!write(ready[1], &c, 1);
      if (signal_self == 0) std::exit(0);  // runs the exit handlers, not the destructors
      if (signal_self == SIGKILL) raise(SIGKILL);
      pause();  // until the parent's SIGTERM
      _exit(3);
    }
    char c = 0;
    CHECK(read(ready[0], &c, 1) == 1);
    close(ready[0]);
    close(ready[1]);
    return child;
  };
  int status = 0;
  waitpid(leakInChild(exiting, 0), &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(!exists(exiting));

  const pid_t term = leakInChild(terminated, SIGTERM);
  CHECK(exists(terminated));
  kill(term, SIGTERM);
  waitpid(term, &status, 0);
  CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM, "status %d: SIGTERM must still terminate", status);
  CHECK(!exists(terminated));

  ShmSegment alive = ShmSegment::create(live, 64, 2, 0);
  waitpid(leakInChild(killed, SIGKILL), &status, 0);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  CHECK(exists(killed));  // nothing ran in the killed process
  CHECK(ShmSegment::removeDeadJobSegments() >= 1);
  CHECK(!exists(killed));
  CHECK(exists(live));  // its creator is alive
  // Whatever a failed check above left (the children never destroy their segments).
  for (const std::string& name : {exiting, terminated, killed}) shm_unlink(name.c_str());
}

// ---- ShmLink ------------------------------------------------------------------

TEST(link_message_sizes_and_many_outstanding) {
  // A 1000-byte ring: sizes around it, far above it, 0 and 1; everything
  // posted at once in both directions, then waited.
  const std::vector<size_t> sizes = {0, 1, 7, 999, 1000, 1001, 8003, 100000, 0, 3};
  for (size_t ring : {size_t(1000), size_t(13), size_t(1) << 20}) {
    const auto cfg = config(strCat("sizes-", ring), ring);
    auto errors = pair([&](int r) {
      ShmLink link(cfg, r, 1 - r);
      CHECK(std::string(link.kind()) == "shm" && link.peer() == 1 - r);
      std::vector<std::vector<unsigned char>> out, in;
      std::vector<std::unique_ptr<LinkRequest>> sends, recvs;
      for (size_t m = 0; m < sizes.size(); ++m) {
        out.push_back(message(r, static_cast<int>(m), sizes[m]));
        in.emplace_back(sizes[m], 0);
      }
      for (size_t m = 0; m < sizes.size(); ++m) {
        sends.push_back(link.isend(out[m].data(), sizes[m]));
        recvs.push_back(link.irecv(in[m].data(), sizes[m]));
      }
      const Deadline dl = Deadline::after(milliseconds(20000));
      // The last receive first: its wait drives all earlier ones.
      recvs.back()->wait(dl);
      for (auto& q : recvs) q->wait(dl);
      for (size_t m = sizes.size(); m-- > 0;) sends[m]->wait(dl);
      for (size_t m = 0; m < sizes.size(); ++m)
        CHECK_MSG(matches(in[m], 1 - r, static_cast<int>(m)), "ring %zu rank %d message %zu", ring, r, m);
    });
    CHECK_MSG(errors[0].empty() && errors[1].empty(), "%s | %s", errors[0].c_str(), errors[1].c_str());
  }
  CHECK(shmEntries(prefixFor("sizes-")).empty());
}

TEST(link_exchange_larger_than_ring_needs_no_send_wait) {
  // Both ranks send 1 MiB through a 4 KiB ring and then block in a receive:
  // only sends that progress by themselves avoid a deadlock here.
  const auto cfg = config("exchange", 4096);
  auto errors = pair([&](int r) {
    ShmLink link(cfg, r, 1 - r);
    const auto out = message(r, 0, 1 << 20);
    std::vector<unsigned char> in(1 << 20);
    auto s = link.isend(out.data(), out.size());
    link.recv(in.data(), in.size(), Deadline::after(milliseconds(20000)));
    s->wait(Deadline::after(milliseconds(20000)));
    CHECK(matches(in, 1 - r, 0));
  });
  CHECK_MSG(errors[0].empty() && errors[1].empty(), "%s | %s", errors[0].c_str(), errors[1].c_str());
}

TEST(link_size_mismatch_is_an_error) {
  const auto cfg = config("mismatch", 4096);
  auto errors = pair([&](int r) {
    ShmLink link(cfg, r, 1 - r);
    std::vector<char> buf(12);
    if (r == 0) {
      link.send(buf.data(), 10, Deadline::after(milliseconds(5000)));
      std::vector<char> done(1);
      link.recv(done.data(), 1, Deadline::after(milliseconds(5000)));  // keep the link until rank 1 has read
    } else {
      std::string what;
      try {
        link.recv(buf.data(), 12, Deadline::after(milliseconds(5000)));
      } catch (const CollectiveError& e) {
        what = e.what();
      }
      CHECK_MSG(what.find("has 10 bytes, expected 12") != std::string::npos, "message: %s", what.c_str());
      CHECK_THROWS(link.recv(buf.data(), 1, Deadline::after(milliseconds(100))), CollectiveError);  // broken now
      link.send(buf.data(), 1, Deadline::after(milliseconds(5000)));
    }
  });
  CHECK_MSG(errors[0].empty() && errors[1].empty(), "%s | %s", errors[0].c_str(), errors[1].c_str());
}

TEST(link_deadlines) {
  const auto cfg = config("deadline", 1024);
  std::atomic<bool> done{false};
  auto errors = pair([&](int r) {
    ShmLink link(cfg, r, 1 - r);
    if (r == 1) {
      while (!done) std::this_thread::sleep_for(milliseconds(5));  // alive, but silent
      return;
    }
    std::vector<char> buf(5000);
    const auto t0 = Clock::now();
    std::string what;
    try {
      link.recv(buf.data(), 100, Deadline::after(milliseconds(200)));
    } catch (const TimeoutError& e) {
      what = e.what();
    }
    CHECK_MSG(what.find("rank 0") != std::string::npos && what.find("rank 1") != std::string::npos &&
                  what.find("100 bytes") != std::string::npos,
              "message: %s", what.c_str());
    CHECK(msSince(t0) < 3000);
    done = true;
  });
  CHECK_MSG(errors[0].empty() && errors[1].empty(), "%s | %s", errors[0].c_str(), errors[1].c_str());

  // A send to a peer that never attaches (larger than the ring, so it cannot
  // complete by itself).
  {
    ShmLink lonely(config("deadline-send", 1024), 0, 1);
    std::vector<char> buf(5000);
    auto s = lonely.isend(buf.data(), buf.size());
    std::string what;
    try {
      s->wait(Deadline::after(milliseconds(200)));
    } catch (const TimeoutError& e) {
      what = e.what();
    }
    CHECK_MSG(what.find("sending 5000 bytes to rank 1") != std::string::npos &&
                  what.find("rank 1 never attached") != std::string::npos,
              "message: %s", what.c_str());
  }
  // The higher rank waits for a segment nobody creates.
  CHECK_THROWS(ShmLink(config("deadline-open", 1024, milliseconds(150)), 1, 0), TimeoutError);
}

TEST(link_sends_complete_without_the_receiver) {
  // Rank 0 sends 40x the ring and has every send complete before rank 1
  // posts a single receive; then it closes its link at once. The staged data
  // must still all arrive, in order.
  const auto cfg = config("staged", 4096);
  std::atomic<bool> sent{false};
  const std::vector<size_t> sizes = {100000, 1, 0, 60000, 4095};
  auto errors = pair([&](int r) {
    ShmLink link(cfg, r, 1 - r);
    if (r == 0) {
      std::vector<std::vector<unsigned char>> out;
      std::vector<std::unique_ptr<LinkRequest>> sends;
      for (size_t m = 0; m < sizes.size(); ++m) {
        out.push_back(message(0, static_cast<int>(m), sizes[m]));
        sends.push_back(link.isend(out.back().data(), sizes[m]));
      }
      // Rank 1 receives only after `sent`: a wait that needed it would time out.
      for (auto& q : sends) q->wait(Deadline::after(milliseconds(5000)));
      for (auto& v : out) std::fill(v.begin(), v.end(), 0);  // the buffers are ours again
      sent = true;
      return;  // the destructor delivers what is staged
    }
    while (!sent) std::this_thread::sleep_for(milliseconds(1));
    for (size_t m = 0; m < sizes.size(); ++m) {
      std::vector<unsigned char> in(sizes[m]);
      link.recv(in.data(), in.size(), Deadline::after(milliseconds(5000)));
      CHECK_MSG(matches(in, 0, static_cast<int>(m)), "message %zu", m);
    }
  });
  CHECK_MSG(errors[0].empty() && errors[1].empty(), "%s | %s", errors[0].c_str(), errors[1].c_str());
}

TEST(link_peer_closing_fails_waits_fast) {
  const auto cfg = config("closed", 1024);
  std::atomic<bool> waiting{false};
  auto errors = pair([&](int r) {
    ShmLink link(cfg, r, 1 - r);
    std::vector<char> buf(100);
    if (r == 1) {
      link.send(buf.data(), 10, Deadline::after(milliseconds(5000)));
      while (!waiting) std::this_thread::sleep_for(milliseconds(1));
      return;  // destroys the link while rank 0 waits
    }
    link.recv(buf.data(), 10, Deadline::after(milliseconds(5000)));
    waiting = true;
    const auto t0 = Clock::now();
    std::string what;
    bool timeout = false;
    const milliseconds deadline(20000);
    try {
      link.recv(buf.data(), 10, Deadline::after(deadline));
    } catch (const TimeoutError&) {
      timeout = true;
    } catch (const CollectiveError& e) {
      what = e.what();
    }
    CHECK(!timeout);
    CHECK_MSG(what.find("peer rank 1 closed") != std::string::npos, "message: %s", what.c_str());
    CHECK_MSG(msSince(t0) < deadline.count() / 10, "took %ld ms", msSince(t0));
  });
  CHECK_MSG(errors[0].empty() && errors[1].empty(), "%s | %s", errors[0].c_str(), errors[1].c_str());
}

TEST(link_data_sent_before_peer_leaves_still_arrives) {
  // Rank 0 sends and closes at once; everything it sent must still arrive.
  const auto cfg = config("drain", 256);
  auto errors = pair([&](int r) {
    ShmLink link(cfg, r, 1 - r);
    if (r == 0) {
      const auto out = message(0, 0, 200);
      link.send(out.data(), out.size(), Deadline::after(milliseconds(5000)));
      return;
    }
    std::this_thread::sleep_for(milliseconds(50));
    std::vector<unsigned char> in(200);
    link.recv(in.data(), in.size(), Deadline::after(milliseconds(5000)));
    CHECK(matches(in, 0, 0));
  });
  CHECK_MSG(errors[0].empty() && errors[1].empty(), "%s | %s", errors[0].c_str(), errors[1].c_str());
}

TEST(ring_allreduce_over_shm_links) {
  // The ring posts sends to one neighbour and waits on receives from the
  // other; with messages far above the ring size this deadlocks unless sends
  // progress by themselves. Mixed layouts put shm and remote hops in one ring.
  int run = 0;
  for (const std::vector<int>& hosts :
       {std::vector<int>{0, 0, 0, 0}, std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 0, 0}}) {
    const auto cfg = config(strCat("ring-", run++), 16 << 10);
    const size_t count = 300001;  // ~300 KiB per chunk: 4-5x the shm ring
    runRanks(
        hosts,
        [&](Context& ctx) {
          RingAllreduce ring({16 << 10, 2});  // many segments per chunk: the ring waits on sends
          std::vector<float> buf(count);
          for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>((ctx.rank() + i) % 7);
          ring.allreduce(ctx, buf.data(), count, DataType::kFloat32, ReduceOp::kSum);
          size_t bad = 0;
          for (size_t i = 0; i < count; ++i) {
            float want = 0;
            for (int r = 0; r < ctx.size(); ++r) want += static_cast<float>((r + i) % 7);
            bad += buf[i] != want;
          }
          CHECK_MSG(bad == 0, "rank %d: %zu wrong", ctx.rank(), bad);
          if (ctx.size() > 1 && ctx.topo().sameHost((ctx.rank() + 1) % ctx.size()))
            CHECK(std::string(ctx.link((ctx.rank() + 1) % ctx.size()).kind()) == "shm");
        },
        milliseconds(30000), [&](int self, int peer) { return makeShmLink(cfg, self, peer); });
  }
}

// ---- across real processes ------------------------------------------------------

TEST(link_between_processes) {
  const auto cfg = config("fork", 64 << 10);
  const std::vector<size_t> sizes = {0, 1, 12345, 3 << 20};
  const pid_t child = fork();
  if (child == 0) {
    int rc = 0;
    try {
      ShmLink link(cfg, 1, 0);
      for (size_t m = 0; m < sizes.size(); ++m) {
        std::vector<unsigned char> in(sizes[m]);
        const auto out = message(1, static_cast<int>(m), sizes[m]);
        auto s = link.isend(out.data(), out.size());
        link.recv(in.data(), in.size(), Deadline::after(milliseconds(20000)));
        s->wait(Deadline::after(milliseconds(20000)));
        if (!matches(in, 0, static_cast<int>(m))) rc = 2;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      rc = 3;
    }
    _exit(rc);
  }
  {
    ShmLink link(cfg, 0, 1);
    for (size_t m = 0; m < sizes.size(); ++m) {
      std::vector<unsigned char> in(sizes[m]);
      const auto out = message(0, static_cast<int>(m), sizes[m]);
      auto s = link.isend(out.data(), out.size());
      link.recv(in.data(), in.size(), Deadline::after(milliseconds(20000)));
      s->wait(Deadline::after(milliseconds(20000)));
      CHECK_MSG(matches(in, 1, static_cast<int>(m)), "message %zu", m);
    }
  }
  int status = 0;
  waitpid(child, &status, 0);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
  CHECK(shmEntries(cfg.prefix).empty());
}

TEST(link_peer_killed_is_detected) {
  const auto cfg = config("kill", 4096);
  const pid_t child = fork();
  if (child == 0) {
    try {
      ShmLink link(cfg, 1, 0);
      const char ready = 'r';
      link.send(&ready, 1, Deadline::after(milliseconds(20000)));
      for (;;) pause();  // until SIGKILL
    } catch (...) {
    }
    _exit(3);
  }
  auto closing = Clock::now();
  {
    ShmLink link(cfg, 0, 1);
    char ready = 0;
    link.recv(&ready, 1, Deadline::after(milliseconds(20000)));
    CHECK(ready == 'r');
    // Kill the child while this rank is blocked in a receive (and a send
    // larger than the ring is pending towards it).
    std::vector<char> big(100000), buf(100);
    auto s = link.isend(big.data(), big.size());
    std::thread killer([child] {
      std::this_thread::sleep_for(milliseconds(200));
      kill(child, SIGKILL);
    });
    const auto t0 = Clock::now();
    const milliseconds deadline(20000);
    std::string what;
    bool timeout = false;
    try {
      link.recv(buf.data(), buf.size(), Deadline::after(deadline));
    } catch (const TimeoutError&) {
      timeout = true;
    } catch (const CollectiveError& e) {
      what = e.what();
    }
    killer.join();
    const long ms = msSince(t0);
    CHECK(!timeout);
    CHECK_MSG(what.find(strCat("rank 0: peer rank 1 (pid ", child, ") died")) != std::string::npos, "message: %s",
              what.c_str());
    CHECK_MSG(ms < 200 + deadline.count() / 10, "detected after %ld ms (kill at 200 ms)", ms);
    // The pending send is owed to a dead peer: waiting on it and closing the
    // link must not hang (the send may count as buffered, or fail).
    try {
      s->wait(Deadline::after(milliseconds(5000)));
    } catch (const CollectiveError&) {
    }
    closing = Clock::now();
  }
  CHECK_MSG(msSince(closing) < 2000, "closing took %ld ms", msSince(closing));
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  CHECK(shmEntries(cfg.prefix).empty());
}

TEST(nothing_left_in_dev_shm) {
  const auto left = shmEntries(prefixFor(""));
  CHECK_MSG(left.empty(), "%zu entries left, e.g. %s", left.size(), left.empty() ? "" : left[0].c_str());
}

HVD_TEST_MAIN()
