// Every reducer against a locally computed reference, on awkward shapes:
// count 0, 1, < size, odd, larger than several segments; world sizes 1-5.
#include <atomic>
#include <cstring>
#include <vector>

#include "algorithms/central_allreduce.h"
#include "algorithms/hierarchical_allgather.h"
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

// Rank r's block of an all-gather test: `sizes[r]` bytes, byte k = r * 31 + k.
char blockByte(int r, size_t k) { return static_cast<char>(r * 31 + static_cast<int>(k)); }

// Every rank's block gathered by `gather` (ring_allgather.h's signature).
std::vector<char> gatherBlocks(Context& ctx, const std::vector<size_t>& sizes,
                               void (*gather)(Context&, const void*, void*, const std::vector<size_t>&)) {
  std::vector<char> in(sizes[ctx.rank()]);
  for (size_t k = 0; k < in.size(); ++k) in[k] = blockByte(ctx.rank(), k);
  size_t total = 0;
  for (size_t n : sizes) total += n;
  std::vector<char> out(total, 0);
  gather(ctx, in.data(), out.data(), sizes);
  return out;
}

// Each rank's block in rank order.
void checkBlocks(const std::vector<char>& out, const std::vector<size_t>& sizes) {
  size_t at = 0;
  for (size_t r = 0; r < sizes.size(); ++r)
    for (size_t k = 0; k < sizes[r]; ++k, ++at)
      CHECK_MSG(out[at] == blockByte(static_cast<int>(r), k), "block of rank %zu, byte %zu", r, k);
}

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
      checkBlocks(gatherBlocks(ctx, sizes, ringAllgatherv), sizes);

      for (int root = 0; root < p; ++root) {
        std::vector<int> data(1000, ctx.rank() == root ? 42 + root : -1);
        chainBroadcast(ctx, data.data(), data.size() * sizeof(int), root, 333);
        for (int v : data) CHECK(v == 42 + root);
      }
    });
  }
}

namespace {

// A fabric link that counts the bytes it sends to another host.
class CountingLink : public Link {
 public:
  CountingLink(std::unique_ptr<Link> inner, std::atomic<size_t>* crossing)
      : inner_(std::move(inner)), crossing_(crossing) {}
  int peer() const override { return inner_->peer(); }
  const char* kind() const override { return inner_->kind(); }
  std::unique_ptr<LinkRequest> isend(const void* data, size_t bytes) override {
    if (crossing_ != nullptr) *crossing_ += bytes;
    return inner_->isend(data, bytes);
  }
  std::unique_ptr<LinkRequest> irecv(void* data, size_t bytes) override { return inner_->irecv(data, bytes); }

 private:
  std::unique_ptr<Link> inner_;
  std::atomic<size_t>* crossing_;
};

// Runs `gather` on ranks placed on hosts by `host_of_rank`; checks every
// block in place and returns the bytes sent between hosts.
size_t gatherAcrossHosts(const std::vector<int>& host_of_rank, const std::vector<size_t>& sizes,
                         void (*gather)(Context&, const void*, void*, const std::vector<size_t>&)) {
  std::atomic<size_t> crossing{0};
  runRanks(
      host_of_rank,
      [&](Context& ctx) {
        const std::vector<char> out = gatherBlocks(ctx, sizes, gather);
        checkBlocks(out, sizes);
      },
      std::chrono::milliseconds(20000), nullptr,
      [&](int self, int peer, std::unique_ptr<Link> link) {
        const bool between_hosts = host_of_rank[peer] != host_of_rank[self];
        return std::make_unique<CountingLink>(std::move(link), between_hosts ? &crossing : nullptr);
      });
  return crossing.load();
}

}  // namespace

TEST(hierarchical_allgather_crosses_each_link_once) {
  // Hosts of 2 and 3 ranks, numbered together or interleaved, blocks of
  // different sizes (one empty): every block in place, and the bytes between
  // hosts are the floor -- each rank's block sent to each other host once --
  // where the flat ring sends more.
  const std::vector<std::vector<int>> layouts = {{0, 0, 1, 1}, {0, 1, 0, 1}, {0, 0, 0, 1, 1, 1}, {0, 0, 1, 1, 2, 2}};
  for (const auto& hosts : layouts) {
    const int p = static_cast<int>(hosts.size());
    int num_hosts = 0;
    for (int h : hosts) num_hosts = std::max(num_hosts, h + 1);
    std::vector<size_t> sizes(p);
    size_t floor = 0;
    for (int r = 0; r < p; ++r) {
      sizes[r] = r == 1 ? 0 : static_cast<size_t>(1000 + 37 * r);
      floor += sizes[r] * static_cast<size_t>(num_hosts - 1);
    }
    CHECK(hierarchicalAllgatherApplies(Topology::build(0, hosts)));
    const size_t two_level = gatherAcrossHosts(hosts, sizes, hierarchicalAllgatherv);
    const size_t flat = gatherAcrossHosts(hosts, sizes, ringAllgatherv);
    CHECK_MSG(two_level == floor, "%d ranks: %zu bytes between hosts, floor %zu", p, two_level, floor);
    CHECK_MSG(flat > floor, "%d ranks: the flat ring sent %zu, floor %zu", p, flat, floor);
  }
  // One host, one rank per host, or hosts of different sizes: not applicable.
  CHECK(!hierarchicalAllgatherApplies(Topology::build(0, {0, 0, 0})));
  CHECK(!hierarchicalAllgatherApplies(Topology::build(0, {0, 1, 2})));
  CHECK(!hierarchicalAllgatherApplies(Topology::build(0, {0, 0, 1})));
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
