#include "algorithms/link_cost.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

#include "algorithms/ring_allreduce.h"
#include "transport/context.h"

namespace hvdtorch {

double linkSeconds(const LinkCost& link, const LinkTraffic& traffic, size_t bytes) {
  if (!link.known()) return 0;
  const double n = static_cast<double>(bytes);
  return link.latency * (traffic.messages + traffic.messages_per_byte * n) +
         link.seconds_per_byte * traffic.bytes_per_byte * n;
}

LinkTraffic ringTraffic(const Topology& topo, const std::vector<int>& members) {
  const size_t p = members.size();
  LinkTraffic t;
  if (p <= 1) return t;
  std::map<int, int> leaving;  // host -> ring edges that leave it
  for (size_t i = 0; i < p; ++i) {
    const int from = topo.host_of_rank[members[i]];
    if (from != topo.host_of_rank[members[(i + 1) % p]]) ++leaving[from];
  }
  if (leaving.empty()) return t;
  int busiest = 0;
  for (const auto& [host, edges] : leaving) busiest = std::max(busiest, edges);
  const double steps = 2.0 * static_cast<double>(p - 1);
  t.messages = steps;
  t.bytes_per_byte = busiest * steps / static_cast<double>(p);
  return t;
}

namespace {

// Least seconds of kLinkReps ring all-reduces of `bytes` among `leaders`, after one untimed.
double timeLeaders(Context& ctx, RingAllreduce& ring, const std::vector<int>& leaders, std::vector<char>& buf,
                   size_t bytes) {
  const size_t count = bytes / sizeof(float);
  ring.allreduceAmong(ctx, leaders, buf.data(), count, DataType::kFloat32, ReduceOp::kSum);
  double best = -1;
  for (int rep = 0; rep < kLinkReps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    ring.allreduceAmong(ctx, leaders, buf.data(), count, DataType::kFloat32, ReduceOp::kSum);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = best < 0 ? s : std::min(best, s);
  }
  return best;
}

}  // namespace

LinkCost measureLink(Context& ctx) {
  const Topology& topo = ctx.topo();
  if (topo.num_hosts <= 1) return {};
  // The host leaders: local rank 0 of every host, ascending.
  std::vector<int> leaders;
  for (int r = 0; r < topo.size; ++r)
    if (topo.local_rank_of[r] == 0) leaders.push_back(r);
  RingAllreduce ring;
  // [latency, seconds per byte] from the leaders, zeros from the others; the max over ranks is the leaders'
  // largest, the same everywhere.
  std::vector<double> fit(2, 0.0);
  if (topo.local_rank == 0) {
    std::vector<char> buf(kLinkLargeBytes, 0);
    const double small = timeLeaders(ctx, ring, leaders, buf, kLinkSmallBytes);
    const double large = timeLeaders(ctx, ring, leaders, buf, kLinkLargeBytes);
    // t(n) = 2(H-1) latency + 2(H-1)/H n seconds_per_byte for a ring among H leaders, one per host.
    const double h = static_cast<double>(leaders.size());
    const double crossings = 2.0 * (h - 1.0);
    const double per_byte = crossings / h;
    const double spb =
        std::max(0.0, (large - small) / (per_byte * static_cast<double>(kLinkLargeBytes - kLinkSmallBytes)));
    fit[0] = std::max(0.0, (small - per_byte * static_cast<double>(kLinkSmallBytes) * spb) / crossings);
    fit[1] = spb;
  }
  ring.allreduce(ctx, fit.data(), fit.size(), DataType::kFloat64, ReduceOp::kMax);
  return LinkCost{fit[0], fit[1]};
}

}  // namespace hvdtorch
