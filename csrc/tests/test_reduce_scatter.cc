// Reduce-scatter with uneven blocks against a locally computed reference:
// the ring's reduce-scatter phase (any world size, blocks of any size
// including empty ones, segments much smaller than a block) and the
// reduce-scatter of the node reducer on hosts of equal size (shared memory
// on the host, many arena rounds, interleaved with all-reduces on the same
// arena; the ring between hosts), plus which reducer a ReducerSet picks.
#include <unistd.h>

#include <string>
#include <vector>

#include "algorithms/node_allreduce.h"
#include "algorithms/reducer_set.h"
#include "algorithms/ring_allreduce.h"
#include "check.h"
#include "common/error.h"
#include "dtype_values.h"
#include "ranks.h"
#include "reference.h"
#include "shm_entries.h"

using namespace hvdtorch;
using hvdtorch::test::get;
using hvdtorch::test::put;
using hvdtorch::test::reference;
using hvdtorch::test::runRanks;
using hvdtorch::test::valueOf;

namespace {

std::string uniquePrefix() { return hvdtorch::test::uniqueShmPrefix("rs"); }

// Block sizes per rank worth testing for world size p.
std::vector<std::vector<size_t>> countPatterns(int p) {
  std::vector<std::vector<size_t>> out;
  out.push_back(std::vector<size_t>(p, 0));  // nothing at all
  out.push_back(std::vector<size_t>(p, 1));
  std::vector<size_t> uneven(p);  // Horovod's split of 7 rows: first 7 % p get one more
  for (int r = 0; r < p; ++r) uneven[r] = 7 / p + (r < 7 % p ? 1 : 0);
  out.push_back(uneven);
  std::vector<size_t> ragged(p);  // zeros in the middle, one large block
  for (int r = 0; r < p; ++r) ragged[r] = r % 2 ? 0 : static_cast<size_t>(1 + r * 300);
  ragged[p - 1] = 5003;
  out.push_back(ragged);
  return out;
}

// One reduce-scatter through `rs` on every rank, checking this rank's block.
void reduceScatterAndCheck(Context& ctx, const std::function<void(void*, const std::vector<size_t>&)>& rs,
                           const std::vector<size_t>& counts, DataType dtype, ReduceOp op, const char* what) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  std::vector<char> buf((total + 1) * dtypeSize(dtype));
  for (size_t i = 0; i < total; ++i) put(dtype, buf.data(), i, valueOf(ctx.rank(), i));
  rs(buf.data(), counts);
  const std::vector<size_t> offsets = blockOffsets(counts);
  const size_t at = offsets[ctx.rank()];
  size_t bad = 0;
  for (size_t i = 0; i < counts[ctx.rank()]; ++i)
    bad += get(dtype, buf.data(), at + i) != reference(op, ctx.size(), at + i);
  CHECK_MSG(bad == 0, "%s p=%d rank=%d %s %s block of %zu: %zu wrong", what, ctx.size(), ctx.rank(), dtypeName(dtype),
            reduceOpName(op), counts[ctx.rank()], bad);
}

struct Case {
  DataType dtype;
  ReduceOp op;
};
const std::vector<Case> kCases = {{DataType::kFloat32, ReduceOp::kSum},
                                  {DataType::kFloat32, ReduceOp::kMax},
                                  {DataType::kInt32, ReduceOp::kProduct},
                                  {DataType::kBFloat16, ReduceOp::kSum}};

}  // namespace

TEST(ring_reduce_scatter_uneven_blocks) {
  for (int p : {1, 2, 3, 4, 5}) {
    for (const auto& counts : countPatterns(p)) {
      runRanks(p, [&](Context& ctx) {
        RingAllreduce ring(RingOptions{256, 2});  // 64-float segments: large blocks take many
        CHECK(ring.hasReduceScatter(ctx));
        for (const Case& c : kCases)
          reduceScatterAndCheck(
              ctx, [&](void* d, const std::vector<size_t>& n) { ring.reduceScatter(ctx, d, n, c.dtype, c.op); }, counts,
              c.dtype, c.op, "ring");
      });
    }
  }
}

TEST(ring_allreduce_still_matches_after_reduce_scatter_on_same_links) {
  runRanks(3, [](Context& ctx) {
    RingAllreduce ring(RingOptions{64, 3});
    for (int k = 0; k < 3; ++k) {
      reduceScatterAndCheck(
          ctx,
          [&](void* d, const std::vector<size_t>& n) {
            ring.reduceScatter(ctx, d, n, DataType::kFloat32, ReduceOp::kSum);
          },
          {5, 0, 301}, DataType::kFloat32, ReduceOp::kSum, "ring interleaved");
      std::vector<float> buf(1001);
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(valueOf(ctx.rank(), i));
      ring.allreduce(ctx, buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
      for (size_t i = 0; i < buf.size(); ++i) CHECK(buf[i] == reference(ReduceOp::kSum, 3, i));
    }
  });
}

TEST(ring_reduce_scatter_among_subgroup) {
  // Ranks {3, 1} (in that ring order) reduce-scatter among themselves while 0 and 2 do the same.
  runRanks(4, [](Context& ctx) {
    RingAllreduce ring({64, 2});
    const std::vector<int> group = ctx.rank() % 2 ? std::vector<int>{3, 1} : std::vector<int>{0, 2};
    std::vector<double> buf(300, ctx.rank() + 1.0);
    const std::vector<Range> blocks = {{0, 100}, {100, 200}};
    ring.reduceScatterAmong(ctx, group, buf.data(), blocks, DataType::kFloat64, ReduceOp::kSum);
    const int pos = group[0] == ctx.rank() ? 0 : 1;
    const double want = ctx.rank() % 2 ? 2.0 + 4.0 : 1.0 + 3.0;
    for (size_t i = blocks[pos].offset; i < blocks[pos].offset + blocks[pos].count; ++i) CHECK(buf[i] == want);
  });
}

TEST(node_reduce_scatter_on_hosts_of_equal_size) {
  // One host, 2 x 2 (numbered together and interleaved), 2 x 3.
  const std::vector<std::vector<int>> layouts = {{0, 0},       {0, 0, 0},    {0, 0, 0, 0},
                                                 {0, 0, 1, 1}, {0, 1, 0, 1}, {0, 0, 0, 1, 1, 1}};
  for (const auto& hosts : layouts) {
    const int p = static_cast<int>(hosts.size());
    for (const auto& counts : countPatterns(p)) {
      NodeOptions o;
      o.shm_prefix = uniquePrefix();
      o.slot_bytes = 256;  // 64 floats per slot: 16-21 per rank and round, so large blocks take many rounds
      o.ring = RingOptions{4096, 2};
      runRanks(hosts, [&](Context& ctx) {
        NodeAllreduce node(o);
        CHECK(node.hasReduceScatter(ctx));
        for (const Case& c : kCases)
          reduceScatterAndCheck(
              ctx, [&](void* d, const std::vector<size_t>& n) { node.reduceScatter(ctx, d, n, c.dtype, c.op); }, counts,
              c.dtype, c.op, "node");
        // The same arena goes on serving all-reduces, and reduce-scatters after them.
        std::vector<float> buf(999);
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(valueOf(ctx.rank(), i));
        node.allreduce(ctx, buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
        for (size_t i = 0; i < buf.size(); ++i) CHECK(buf[i] == reference(ReduceOp::kSum, p, i));
        reduceScatterAndCheck(
            ctx,
            [&](void* d, const std::vector<size_t>& n) {
              node.reduceScatter(ctx, d, n, DataType::kFloat32, ReduceOp::kSum);
            },
            counts, DataType::kFloat32, ReduceOp::kSum, "node after allreduce");
      });
      CHECK(hvdtorch::test::shmEntries(o.shm_prefix).empty());
    }
  }
}

TEST(node_reduce_scatter_only_on_hosts_of_equal_size) {
  // Hosts of different sizes, or one rank per host: the ring's.
  for (const auto& hosts : {std::vector<int>{0, 0, 1}, std::vector<int>{0, 1, 2}}) {
    NodeOptions o;
    o.shm_prefix = uniquePrefix();
    runRanks(hosts, [&](Context& ctx) {
      NodeAllreduce node(o);
      CHECK(!node.hasReduceScatter(ctx));
      std::vector<float> buf(3);
      CHECK_THROWS(node.reduceScatter(ctx, buf.data(), {1, 1, 1}, DataType::kFloat32, ReduceOp::kSum), InvalidArgument);
    });
  }
}

TEST(reducer_set_picks_a_reduce_scatter) {
  // One host with shared memory: the node reducer; two hosts, or no shared memory: the ring.
  const std::string prefix = uniquePrefix();
  for (const auto& hosts : {std::vector<int>{0, 0, 0}, std::vector<int>{0, 1, 1}}) {
    for (bool shm : {true, false}) {
      runRanks(hosts, [&](Context& ctx) {
        ReducerEnv env;
        if (shm) env.shm_prefix = prefix;
        ReducerSet set(env);
        Reducer& r = set.reduceScatterer(ctx, 1 << 20, DataType::kFloat32, ReduceOp::kSum);
        const bool one_host = ctx.topo().num_hosts == 1;
        CHECK(std::string(r.name()) == (shm && one_host ? "node" : "ring"));
        reduceScatterAndCheck(
            ctx,
            [&](void* d, const std::vector<size_t>& n) {
              r.reduceScatter(ctx, d, n, DataType::kFloat32, ReduceOp::kSum);
            },
            {3, 0, 10}, DataType::kFloat32, ReduceOp::kSum, "reducer set");
      });
    }
  }
}

TEST(nothing_left_in_dev_shm) {
  const auto left = hvdtorch::test::shmEntries(hvdtorch::test::testShmPrefix());
  CHECK_MSG(left.empty(), "%zu entries left, e.g. %s", left.size(), left.empty() ? "" : left[0].c_str());
}

HVD_TEST_MAIN()
