// Scale of negotiation: N in-process ranks (threads over in-process links),
// one steady-state cycle after another, for
//   star     every rank sends its RankMessage (cache bits) to rank 0, which
//            runs the coordinator and sends the ResponseList back (today's
//            ControlPlane::exchange),
//   flat     the bitwise-AND all-reduce by recursive doubling,
//   hier     the same with hosts of 8 ranks: a tree inside each host, one
//            rank per host across hosts,
// and with a share of cycles carrying an uncached request (the AND's status
// bit then sends that cycle through the star as well).
// Prints, per N and path, the busiest rank's messages and bytes per cycle,
// the cycle's wall time here (median and p10-p90 over rounds) and the
// busiest rank's CPU time per cycle (its thread's CPU clock). On a machine
// with fewer cores than ranks the wall time measures the total work of all
// ranks, not what one cycle costs when every rank has its own core; the
// busiest rank's CPU time is the part of the cycle that cannot overlap.
// Then it projects both paths to 1,024 and 16,384 ranks with an
// alpha-beta model: cycle = (busiest rank's messages) x alpha + (sequential
// steps) x L, alpha fitted from the CPU times measured here, L a stated
// network latency.
//
// usage: bench_control_plane [max_ranks=256] [cycles=200]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "engine/negotiation/bit_allreduce.h"
#include "engine/negotiation/control_plane.h"
#include "engine/negotiation/coordinator.h"
#include "engine/negotiation/response_cache.h"
#include "engine/request.h"
#include "ops/op_table.h"
#include "transport/context.h"
#include "transport/inproc_link.h"

using namespace hvdtorch;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kCached = 64;   // cached ops known to every rank
constexpr int kPending = 16;  // of which pending in a cycle
constexpr int kPerHost = 8;

class CountingLink : public Link {
 public:
  CountingLink(std::unique_ptr<Link> inner, std::atomic<long>* msgs, std::atomic<long>* bytes)
      : inner_(std::move(inner)), msgs_(msgs), bytes_(bytes) {}
  int peer() const override { return inner_->peer(); }
  const char* kind() const override { return inner_->kind(); }
  std::unique_ptr<LinkRequest> isend(const void* d, size_t n) override {
    ++*msgs_;
    *bytes_ += static_cast<long>(n);
    return inner_->isend(d, n);
  }
  std::unique_ptr<LinkRequest> irecv(void* d, size_t n) override {
    ++*msgs_;
    *bytes_ += static_cast<long>(n);
    return inner_->irecv(d, n);
  }

 private:
  std::unique_ptr<Link> inner_;
  std::atomic<long>* msgs_;
  std::atomic<long>* bytes_;
};

Request cachedRequest(int i) {
  Request q;
  q.type = OpType::kAllreduce;
  q.name = "grad." + std::to_string(i);
  q.tensors = {{DataType::kFloat32, {1024}}};
  q.args = ReduceArgs{};
  return q;
}

enum class Path { kStar, kFlat, kHier };
const char* pathName(Path p) { return p == Path::kStar ? "star" : p == Path::kFlat ? "flat" : "hier"; }

struct Result {
  double median_us, p10_us, p90_us;
  double busiest_msgs, busiest_bytes;  // per cycle
  double busiest_cpu_us;               // per cycle
};

double threadCpuUs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e6 + double(ts.tv_nsec) / 1e3;
}

// `uncached_every`: every k-th cycle carries one uncached request on every
// rank (0: never).
Result run(int n, Path path, int cycles, int uncached_every) {
  std::vector<int> hosts(n);
  for (int r = 0; r < n; ++r) hosts[r] = path == Path::kHier ? r / kPerHost : 0;
  InProcFabric fabric(n), local(n);
  std::vector<std::atomic<long>> msgs(n), bytes(n);
  std::vector<double> cpu_us(n, 0.0);
  std::vector<double> round_us;
  std::atomic<int> arrived{0};
  std::atomic<int> round{0};
  const int rounds = 5;
  const int per_round = std::max(1, cycles / rounds);
  std::vector<Clock::time_point> round_start(rounds), round_end(rounds);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Context::LinkFactory remote = [&, r](int peer) {
        return std::make_unique<CountingLink>(fabric.link(r, peer), &msgs[r], &bytes[r]);
      };
      Context::LinkFactory same_host;
      if (path == Path::kHier)
        same_host = [&, r](int peer) {
          return std::make_unique<CountingLink>(local.link(r, peer), &msgs[r], &bytes[r]);
        };
      Context ctx(Topology::build(r, hosts), remote, same_host, nullptr, std::chrono::milliseconds(60000));
      ControlPlane plane(ctx);
      ResponseCache cache(kCached);
      for (int i = 0; i < kCached; ++i) cache.put(cachedRequest(i));
      Coordinator coord(n, std::chrono::seconds(60), std::chrono::seconds(600), [](const std::string&) {});
      for (int k = 0; k < rounds; ++k) {
        // Align the rounds: nobody starts before everyone finished the last one.
        const int target = (k + 1) * n;
        arrived.fetch_add(1);
        while (arrived.load() < target) std::this_thread::yield();
        if (r == 0) round_start[k] = Clock::now();
        const double cpu0 = threadCpuUs();
        for (int c = 0; c < per_round; ++c) {
          const bool uncached = uncached_every > 0 && (k * per_round + c) % uncached_every == 0;
          RankMessage m;
          m.cache_bits.assign(cache.words(), 0);
          for (int i = 0; i < kPending; ++i) m.cache_bits[i / 64] |= uint64_t(1) << (i % 64);
          if (uncached) m.uncached.push_back(cachedRequest(1000 + k * per_round + c));
          bool need_star = path == Path::kStar;
          if (path != Path::kStar) {
            // Word 0: status ("nothing uncached here" = 1, ANDed), then the bits.
            std::vector<uint64_t> v(1 + m.cache_bits.size());
            v[0] = uncached ? 0 : 1;
            std::copy(m.cache_bits.begin(), m.cache_bits.end(), v.begin() + 1);
            bitAndAllreduce(ctx, v, ctx.deadline(),
                            path == Path::kFlat ? BitAllreduceShape::kFlat : BitAllreduceShape::kHierarchical);
            need_star = v[0] == 0;
          }
          if (need_star) {
            plane.exchange(m.serialize(), [&](std::vector<std::vector<char>>& all) {
              std::vector<RankMessage> ms;
              for (const auto& b : all) ms.push_back(RankMessage::parse(b));
              return coord.process(ms, cache, Coordinator::Clock::now()).serialize();
            });
          }
        }
        cpu_us[r] += threadCpuUs() - cpu0;
        if (r == 0) round_end[k] = Clock::now();
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<double> per_cycle;
  for (int k = 0; k < rounds; ++k)
    per_cycle.push_back(std::chrono::duration<double, std::micro>(round_end[k] - round_start[k]).count() / per_round);
  std::sort(per_cycle.begin(), per_cycle.end());
  long worst_msgs = 0, worst_bytes = 0;
  double worst_cpu = 0;
  for (int r = 0; r < n; ++r) {
    worst_msgs = std::max(worst_msgs, msgs[r].load());
    worst_bytes = std::max(worst_bytes, bytes[r].load());
    worst_cpu = std::max(worst_cpu, cpu_us[r]);
  }
  const double total = double(rounds * per_round);
  return {per_cycle[rounds / 2], per_cycle.front(),   per_cycle.back(),
          worst_msgs / total,    worst_bytes / total, worst_cpu / total};
}

}  // namespace

int main(int argc, char** argv) {
  useOpTable(ops::opTable());  // no Engine here to hand it over (engine/op_spec.h)
  const int max_ranks = argc > 1 ? std::atoi(argv[1]) : 256;
  const int cycles = argc > 2 ? std::atoi(argv[2]) : 200;
  std::printf(
      "# control-plane cycle, in-process ranks (threads), %d cached ops, %d pending per cycle, "
      "hier: %d ranks per host\n",
      kCached, kPending, kPerHost);
  std::printf("%-6s %-8s %-10s %12s %14s %12s %22s %16s\n", "ranks", "path", "uncached", "msgs/cycle", "bytes/cycle",
              "wall us", "p10-p90 us", "busiest cpu us");
  struct Row {
    int n;
    Path path;
    int uncached;
    Result r;
  };
  std::vector<Row> rows;
  for (int n = 2; n <= max_ranks; n *= 2) {
    for (int uncached : {0, 10}) {
      for (Path p : {Path::kStar, Path::kFlat, Path::kHier}) {
        if (p == Path::kHier && n <= kPerHost) continue;
        const Result res = run(n, p, cycles, uncached);
        rows.push_back({n, p, uncached, res});
        std::printf("%-6d %-8s %-10s %12.1f %14.0f %12.1f %10.1f-%-10.1f %16.1f\n", n, pathName(p),
                    uncached ? "1 in 10" : "none", res.busiest_msgs, res.busiest_bytes, res.median_us, res.p10_us,
                    res.p90_us, res.busiest_cpu_us);
        std::fflush(stdout);
      }
    }
  }
  // Model: the busiest rank handles its messages one after another (alpha
  // each, fitted from its measured CPU time at the largest N), and each
  // sequential step adds the network latency L. Star: 2 steps, rank 0
  // handles 2(N-1) messages. AND: 2 log2 N + 2 steps and messages at most.
  constexpr double kLatencyUs = 10;  // one-way, a datacenter network
  double alpha_star = 0, alpha_and = 0;
  for (const Row& row : rows) {
    if (row.uncached || row.n != rows.back().n) continue;
    if (row.path == Path::kStar) alpha_star = row.r.busiest_cpu_us / row.r.busiest_msgs;
    if (row.path == Path::kHier) alpha_and = row.r.busiest_cpu_us / row.r.busiest_msgs;
  }
  std::printf("\n# projection, all cached: alpha fitted here (star %.2f us, AND %.2f us per message), L = %.0f us\n",
              alpha_star, alpha_and, kLatencyUs);
  std::printf("%-8s %-6s %12s %12s\n", "ranks", "path", "msgs/cycle", "cycle us");
  for (int n : {256, 1024, 16384}) {
    const double star_msgs = 2.0 * (n - 1);
    const double and_steps = 2.0 * std::ceil(std::log2(n)) + 2;
    std::printf("%-8d %-6s %12.0f %12.0f\n", n, "star", star_msgs, star_msgs * alpha_star + 2 * kLatencyUs);
    std::printf("%-8d %-6s %12.0f %12.0f\n", n, "AND", and_steps, and_steps * (alpha_and + kLatencyUs));
  }
  return 0;
}
