// The pairwise alltoall (alltoallv) against a locally computed reference, on
// 1-5 in-process ranks: equal and uneven blocks, empty blocks, a rank that
// sends nothing, blocks larger than a shared-memory ring (over shm links),
// mismatched own-block sizes rejected before anything is sent, and a missing
// peer turning into an error rather than a hang.
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "algorithms/alltoall.h"
#include "check.h"
#include "common/error.h"
#include "ranks.h"
#include "shm_entries.h"
#include "transport/shm/link.h"

using namespace hvdtorch;
using hvdtorch::test::runRanks;

namespace {

// Byte i of the block rank `src` sends to rank `dst`: every byte says where it came from.
unsigned char byteOf(int src, int dst, size_t i) { return static_cast<unsigned char>(src * 37 + dst * 11 + i * 5 + 1); }

// sizes[src][dst]: bytes src sends to dst.
using Matrix = std::vector<std::vector<size_t>>;

// Runs one alltoall with `sizes` on every rank of `ctx` and checks the output.
void exchangeAndCheck(Context& ctx, const Matrix& sizes, const char* what) {
  const int p = ctx.size();
  const int me = ctx.rank();
  AlltoallOptions opts;
  opts.send_bytes = sizes[me];
  for (int src = 0; src < p; ++src) opts.recv_bytes.push_back(sizes[src][me]);
  std::vector<unsigned char> in, out;
  for (int dst = 0; dst < p; ++dst)
    for (size_t i = 0; i < sizes[me][dst]; ++i) in.push_back(byteOf(me, dst, i));
  size_t total = 0;
  for (size_t b : opts.recv_bytes) total += b;
  out.assign(total + 1, 0xEE);  // one guard byte past the end
  opts.input = in.data();
  opts.output = out.data();
  alltoall(ctx, opts);
  size_t at = 0, bad = 0;
  for (int src = 0; src < p; ++src)
    for (size_t i = 0; i < sizes[src][me]; ++i) bad += out[at++] != byteOf(src, me, i);
  CHECK_MSG(bad == 0, "%s p=%d rank=%d: %zu wrong bytes", what, p, me, bad);
  CHECK_MSG(out[total] == 0xEE, "%s p=%d rank=%d: wrote past the output", what, p, me);
}

Matrix uniform(int p, size_t n) { return Matrix(p, std::vector<size_t>(p, n)); }

// Different for every pair, zero on some pairs, rank 1 sends nothing at all,
// and every other rank keeps a non-empty block of its own (the diagonal is
// (10 s + 1) % 5 = 1 block of 13 bytes): a rank's copy to itself is checked
// at an offset that differs between its input and its output.
Matrix uneven(int p) {
  Matrix m(p, std::vector<size_t>(p));
  for (int s = 0; s < p; ++s)
    for (int d = 0; d < p; ++d) m[s][d] = (s == 1) ? 0 : static_cast<size_t>((s * 7 + d * 3 + 1) % 5) * 13;
  return m;
}

}  // namespace

TEST(alltoall_matches_reference) {
  for (int p : {1, 2, 3, 4, 5}) {
    runRanks(p, [&](Context& ctx) {
      exchangeAndCheck(ctx, uniform(p, 0), "empty");
      exchangeAndCheck(ctx, uniform(p, 1), "one byte");
      exchangeAndCheck(ctx, uniform(p, 4096), "uniform");
      exchangeAndCheck(ctx, uneven(p), "uneven");
      // Several in a row on the same links: messages must not cross.
      for (int k = 0; k < 5; ++k) exchangeAndCheck(ctx, k % 2 ? uneven(p) : uniform(p, 17 * k), "repeated");
    });
  }
}

TEST(alltoall_over_shared_memory_larger_than_the_ring) {
  ShmLinkConfig cfg;
  cfg.prefix = hvdtorch::test::uniqueShmPrefix("a2a");
  cfg.ring_bytes = 4096;  // every block streams through the ring in pieces
  for (int p : {2, 3, 4}) {
    runRanks(
        std::vector<int>(p, 0),
        [&](Context& ctx) {
          exchangeAndCheck(ctx, uniform(p, 100000), "shm uniform");
          exchangeAndCheck(ctx, uneven(p), "shm uneven");
        },
        std::chrono::milliseconds(20000), [&](int self, int peer) { return makeShmLink(cfg, self, peer); });
  }
  CHECK(hvdtorch::test::shmEntries(cfg.prefix).empty());
}

TEST(alltoall_rejects_inconsistent_own_block_before_sending) {
  runRanks(1, [](Context& ctx) {
    std::vector<char> in(8), out(8);
    AlltoallOptions opts{in.data(), {8}, out.data(), {4}};
    CHECK_THROWS(alltoall(ctx, opts), InvalidArgument);
    AlltoallOptions wrong_length{in.data(), {4, 4}, out.data(), {8}};
    CHECK_THROWS(alltoall(ctx, wrong_length), InvalidArgument);
  });
}

TEST(alltoall_missing_peer_raises_not_hangs) {
  bool raised = false;
  try {
    runRanks(
        std::vector<int>{0, 0, 0},
        [](Context& ctx) {
          if (ctx.rank() == 2) return;  // never joins
          exchangeAndCheck(ctx, uniform(3, 64), "missing peer");
        },
        std::chrono::milliseconds(300));
  } catch (const CollectiveError&) {
    raised = true;
  }
  CHECK(raised);
}

HVD_TEST_MAIN()
