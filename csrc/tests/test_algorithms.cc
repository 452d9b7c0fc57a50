// Every reducer against a locally computed reference, on awkward shapes:
// count 0, 1, < size, odd, larger than several segments; world sizes 1-5.
#include <cstring>
#include <vector>

#include "algorithms/central_allreduce.h"
#include "algorithms/ring_allgather.h"
#include "algorithms/ring_allreduce.h"
#include "check.h"
#include "common/error.h"
#include "device/reduce_kernels.h"
#include "ranks.h"
#include "reference.h"

using namespace hvdtorch;
using hvdtorch::test::runRanks;

namespace {

using hvdtorch::test::reference;
using hvdtorch::test::valueOf;

void checkReducer(const std::function<std::unique_ptr<Reducer>()>& make, const char* what) {
  for (int p : {1, 2, 3, 4, 5}) {
    for (size_t count : {size_t(0), size_t(1), size_t(p > 1 ? p - 1 : 1), size_t(1001), size_t(70001)}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kProduct}) {
        runRanks(p, [&](Context& ctx) {
          auto reducer = make();
          std::vector<float> buf(count);
          for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(valueOf(ctx.rank(), i));
          reducer->allreduce(ctx, buf.data(), count, DataType::kFloat32, op);
          size_t bad = 0;
          for (size_t i = 0; i < count; ++i) bad += buf[i] != reference(op, p, i);
          CHECK_MSG(bad == 0, "%s p=%d count=%zu op=%s rank=%d: %zu wrong", what, p, count, reduceOpName(op),
                    ctx.rank(), bad);
        });
      }
    }
  }
}

}  // namespace

TEST(ring_matches_reference) {
  // Tiny segments and window force many in-flight segments per chunk.
  checkReducer([] { return std::make_unique<RingAllreduce>(RingOptions{4096, 3}); }, "ring");
  checkReducer([] { return std::make_unique<RingAllreduce>(RingOptions{1, 1}); }, "ring-1byte");
}

TEST(central_matches_reference) {
  checkReducer([] { return std::make_unique<CentralAllreduce>(CentralOptions{1, 8192}); }, "central");
  checkReducer([] { return std::make_unique<CentralAllreduce>(CentralOptions{3, 8192}); }, "central-3shards");
}

TEST(ring_half_precision) {
  runRanks(3, [](Context& ctx) {
    RingAllreduce ring({64, 2});
    const size_t n = 999;
    std::vector<uint16_t> buf(n);
    for (size_t i = 0; i < n; ++i) buf[i] = floatToBf16(static_cast<float>(valueOf(ctx.rank(), i)));
    ring.allreduce(ctx, buf.data(), n, DataType::kBFloat16, ReduceOp::kSum);
    for (size_t i = 0; i < n; ++i) CHECK(bf16ToFloat(buf[i]) == reference(ReduceOp::kSum, 3, i));
  });
}

TEST(ring_among_subgroup) {
  // Ranks {1, 3} reduce among themselves while 0 and 2 do the same.
  runRanks(4, [](Context& ctx) {
    RingAllreduce ring({256, 2});
    std::vector<int> group = ctx.rank() % 2 ? std::vector<int>{1, 3} : std::vector<int>{0, 2};
    std::vector<double> buf(513, ctx.rank() + 1.0);
    ring.allreduceAmong(ctx, group, buf.data(), buf.size(), DataType::kFloat64, ReduceOp::kSum);
    const double want = ctx.rank() % 2 ? 2.0 + 4.0 : 1.0 + 3.0;
    for (double v : buf) CHECK(v == want);
  });
}

TEST(allgatherv_and_broadcast) {
  for (int p : {1, 2, 3, 4}) {
    runRanks(p, [p](Context& ctx) {
      std::vector<size_t> sizes(p);
      for (int r = 0; r < p; ++r) sizes[r] = static_cast<size_t>(r * 3 + (r == 1 ? 0 : 1));  // rank 1 sends nothing
      std::vector<char> in(sizes[ctx.rank()], static_cast<char>('a' + ctx.rank()));
      size_t total = 0;
      for (size_t s : sizes) total += s;
      std::vector<char> out(total, 0);
      ringAllgatherv(ctx, in.data(), out.data(), sizes);
      size_t off = 0;
      for (int r = 0; r < p; ++r)
        for (size_t k = 0; k < sizes[r]; ++k) CHECK(out[off++] == static_cast<char>('a' + r));

      for (int root = 0; root < p; ++root) {
        std::vector<int> data(1000, ctx.rank() == root ? 42 + root : -1);
        chainBroadcast(ctx, data.data(), data.size() * sizeof(int), root, 333);
        for (int v : data) CHECK(v == 42 + root);
      }
    });
  }
}

TEST(dead_peer_raises_not_hangs) {
  // Rank 1 never joins: both other ranks must fail by the deadline, each by
  // itself (a ring rank only knows the neighbour it waited for).
  const auto outcomes = hvdtorch::test::runRanksOutcomes(
      std::vector<int>{0, 0, 0},
      [](Context& ctx) {
        if (ctx.rank() == 1) return;
        RingAllreduce ring;
        std::vector<float> buf(100, 1.f);
        ring.allreduce(ctx, buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
      },
      std::chrono::milliseconds(300));
  CHECK(outcomes[1].ok());
  for (int r : {0, 2}) {
    bool collective = false;
    try {
      if (outcomes[r].error) std::rethrow_exception(outcomes[r].error);
    } catch (const CollectiveError&) {
      collective = true;
    } catch (...) {
    }
    CHECK_MSG(collective, "rank %d: %s", r, outcomes[r].what.c_str());
    CHECK_MSG(outcomes[r].what.find("timed out receiving from rank") != std::string::npos, "rank %d: %s", r,
              outcomes[r].what.c_str());
  }
}

HVD_TEST_MAIN()
