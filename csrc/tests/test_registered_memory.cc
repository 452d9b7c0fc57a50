// Registered buffers and the node reducer's in-place path: find() and
// release of the registry, peers mapping and dropping buffers, and node
// all-reduces of registered buffers (every rank registered, or only some,
// at an offset inside the buffer, many chunks, many calls, several hosts)
// against the reference -- and that the registered ranks really skipped the
// copies (their chunks ran in place).
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/node_allreduce.h"
#include "check.h"
#include "common/error.h"
#include "ranks.h"
#include "reference.h"
#include "shm_entries.h"
#include "transport/shm/registered_memory.h"

using namespace hvdtorch;
using hvdtorch::test::reference;
using hvdtorch::test::runRanks;
using hvdtorch::test::shmEntries;
using hvdtorch::test::valueOf;

namespace {

std::string uniquePrefix(const char* what) { return hvdtorch::test::uniqueShmPrefix(what); }

}  // namespace

TEST(find_reports_only_live_ranges_of_own_buffers) {
  RegisteredMemory mem(uniquePrefix("reg"), 0, {0, 1});
  auto buf = mem.allocate(1000);
  char* base = static_cast<char*>(buf.get());
  for (int i = 0; i < 1000; ++i) CHECK(base[i] == 0);  // zero-filled
  RegisteredRef ref;
  CHECK(mem.find(base, 1000, &ref) && ref.offset == 0 && ref.owner == 0 && ref.id != 0 && ref.bytes == 1000);
  CHECK(mem.find(base + 100, 900, &ref) && ref.offset == 100);
  CHECK(!mem.find(base + 100, 901, &ref));  // runs past the end
  std::vector<char> plain(64);
  CHECK(!mem.find(plain.data(), 64, &ref));
  auto second = mem.allocate(10);
  CHECK(mem.ownBuffers() == 2);
  buf.reset();
  CHECK(mem.ownBuffers() == 1);
  CHECK(!mem.find(base, 1, &ref) || ref.id != 1);  // the freed buffer is gone
  CHECK_THROWS(mem.allocate(0), InvalidArgument);
  const std::vector<int> host = {0, 1};
  CHECK_THROWS(RegisteredMemory(uniquePrefix("reg"), 2, host), InvalidArgument);
}

TEST(buffer_outlives_its_registry) {
  std::shared_ptr<void> buf;
  {
    RegisteredMemory mem(uniquePrefix("reg"), 0, {0, 1});
    buf = mem.allocate(4096);
  }
  std::memset(buf.get(), 7, 4096);  // still mapped
  buf.reset();
}

TEST(peer_maps_a_buffer_and_drops_it_once_released) {
  const std::string prefix = uniquePrefix("reg");
  RegisteredMemory owner(prefix, 3, {3, 5});
  RegisteredMemory peer(prefix, 5, {3, 5});
  auto buf = owner.allocate(4096);
  RegisteredRef ref;
  CHECK(owner.find(buf.get(), 4096, &ref));
  char* seen = peer.peerBuffer(ref, Deadline::after(std::chrono::seconds(5)));
  static_cast<char*>(buf.get())[10] = 42;
  CHECK(seen[10] == 42);  // the same memory
  seen[11] = 43;
  CHECK(static_cast<char*>(buf.get())[11] == 43);
  CHECK(peer.peerBuffer(ref, Deadline::after(std::chrono::seconds(5))) == seen);  // cached
  CHECK(peer.peerMappings() == 1);
  buf.reset();
  auto other = owner.allocate(64);
  RegisteredRef ref2;
  CHECK(owner.find(other.get(), 64, &ref2));
  peer.peerBuffer(ref2, Deadline::after(std::chrono::seconds(5)));
  CHECK_MSG(peer.peerMappings() == 1, "the released buffer is still mapped (%zu mappings)", peer.peerMappings());
  ref2.owner = 9;  // not on this host
  CHECK_THROWS(peer.peerBuffer(ref2, Deadline::after(std::chrono::seconds(1))), CollectiveError);
}

namespace {

// One node all-reduce per call; ranks for which `registered_rank` holds keep
// their data in a registered buffer, `lead` elements into it.
void registeredAllreduce(const std::vector<int>& hosts, size_t slot_bytes, const std::vector<size_t>& counts,
                         const std::function<bool(int)>& registered_rank, size_t lead = 0) {
  NodeOptions o;
  o.shm_prefix = uniquePrefix("node");
  o.slot_bytes = slot_bytes;
  o.ring = RingOptions{4096, 2};
  const std::string reg_prefix = uniquePrefix("reg");
  runRanks(hosts, [&](Context& ctx) {
    NodeOptions mine = o;
    mine.registered = std::make_shared<RegisteredMemory>(reg_prefix, ctx.rank(), ctx.topo().local_ranks);
    NodeAllreduce reducer(mine);
    const bool in_place = registered_rank(ctx.rank());
    size_t max_count = 0;
    for (size_t c : counts) max_count = std::max(max_count, c);
    std::shared_ptr<void> reg = mine.registered->allocate((lead + max_count) * sizeof(float) + 1);
    std::vector<float> plain(lead + max_count);
    float* data = (in_place ? static_cast<float*>(reg.get()) : plain.data()) + lead;
    size_t expected_in_place = 0;
    for (size_t call = 0; call < counts.size(); ++call) {
      const size_t count = counts[call];
      for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(valueOf(ctx.rank(), i + call));
      reducer.allreduce(ctx, data, count, DataType::kFloat32, ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) {
        const double want = reference(ReduceOp::kSum, ctx.size(), i + call);
        CHECK_MSG(data[i] == static_cast<float>(want), "rank %d call %zu count %zu: [%zu] = %g, want %g (%s)",
                  ctx.rank(), call, count, i, data[i], want, in_place ? "registered" : "plain");
      }
      const size_t chunk = slot_bytes / sizeof(float);
      if (in_place && ctx.topo().local_size > 1 && ctx.topo().homogeneous() && count > 0)
        expected_in_place += (count + chunk - 1) / chunk;
    }
    CHECK_MSG(reducer.inPlaceChunks() == expected_in_place, "rank %d: %llu chunks in place, want %zu", ctx.rank(),
              static_cast<unsigned long long>(reducer.inPlaceChunks()), expected_in_place);
  });
}

const std::vector<size_t> kCounts = {1, 3, 64, 1001, 7001, 0, 5, 4096, 63};

}  // namespace

TEST(node_all_registered_matches_reference) {
  for (const auto& hosts :
       {std::vector<int>{0, 0}, std::vector<int>{0, 0, 0, 0}, std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 0, 0}})
    registeredAllreduce(hosts, 256, kCounts, [](int) { return true; });
}

TEST(node_some_registered_matches_reference) {
  // Ranks with plain buffers keep the copy path in the same rounds.
  registeredAllreduce({0, 0, 0, 0}, 256, kCounts, [](int r) { return r % 2 == 0; });
  registeredAllreduce({0, 0, 0}, 256, kCounts, [](int r) { return r == 1; });
  registeredAllreduce({0, 0, 1, 1}, 256, kCounts, [](int r) { return r == 0 || r == 3; });
}

TEST(node_registered_at_an_offset_and_many_calls) {
  std::vector<size_t> counts;
  for (int call = 0; call < 200; ++call) counts.push_back(1 + static_cast<size_t>(call * 37) % 90);
  registeredAllreduce({0, 0, 0, 0}, 128, counts, [](int) { return true; }, 13);
  registeredAllreduce({0, 0}, 128, counts, [](int r) { return r == 1; }, 5);
}

TEST(node_registered_default_slot_large_message) {
  registeredAllreduce({0, 0}, size_t(4) << 20, {(size_t(4) << 20) / 4 * 3 + 777}, [](int) { return true; });
}

TEST(names_of_a_killed_owner_are_removed_by_a_peer) {
  // A child process allocates a buffer nobody maps, then is killed: its name
  // stays until a peer's RegisteredMemory goes away.
  // The child says when allocate() has returned: the name appears in
  // /dev/shm before the segment's header is written, and a segment killed
  // before that cannot be told from one still being created.
  const std::string prefix = uniquePrefix("reg");
  int ready[2];
  CHECK(pipe(ready) == 0);
  const pid_t child = fork();
  if (child == 0) {
    close(ready[0]);
    RegisteredMemory owner(prefix, 1, {0, 1});
    auto buf = owner.allocate(4096);
    const char byte = 1;
    if (write(ready[1], &byte, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  pollfd pfd{ready[0], POLLIN, 0};
  CHECK_MSG(poll(&pfd, 1, 5000) == 1, "the child did not allocate within 5 s");
  close(ready[0]);
  CHECK(shmEntries(prefix + "-g1-").size() == 1);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(shmEntries(prefix + "-g1-").size() == 1);  // left by the killed owner
  {
    RegisteredMemory peer(prefix, 0, {0, 1});
  }
  CHECK_MSG(shmEntries(prefix).empty(), "%zu left", shmEntries(prefix).size());
}

TEST(nothing_left_in_dev_shm) {
  const auto left = shmEntries(strCat("/hvdtest-", getpid(), "-"));
  CHECK_MSG(left.empty(), "%zu entries left, e.g. %s", left.size(), left.empty() ? "" : left[0].c_str());
}

HVD_TEST_MAIN()
