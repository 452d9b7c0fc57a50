#include "transport/topology.h"

#include <algorithm>

namespace hvdtorch {

Topology Topology::build(int rank, const std::vector<int>& host_of_rank) {
  Topology t;
  t.rank = rank;
  t.size = static_cast<int>(host_of_rank.size());
  t.host_of_rank = host_of_rank;
  t.num_hosts = 0;
  for (int h : host_of_rank) t.num_hosts = std::max(t.num_hosts, h + 1);

  std::vector<int> seen_per_host(t.num_hosts, 0);
  t.local_rank_of.assign(t.size, 0);
  for (int r = 0; r < t.size; ++r) t.local_rank_of[r] = seen_per_host[host_of_rank[r]]++;

  const int my_host = host_of_rank[rank];
  t.local_rank = t.local_rank_of[rank];
  t.local_ranks.clear();
  t.cross_ranks.clear();
  for (int r = 0; r < t.size; ++r) {
    if (host_of_rank[r] == my_host) t.local_ranks.push_back(r);
    if (t.local_rank_of[r] == t.local_rank) t.cross_ranks.push_back(r);
  }
  t.local_size = static_cast<int>(t.local_ranks.size());
  t.cross_size = static_cast<int>(t.cross_ranks.size());
  t.cross_rank = static_cast<int>(std::find(t.cross_ranks.begin(), t.cross_ranks.end(), rank) - t.cross_ranks.begin());
  return t;
}

bool Topology::homogeneous() const {
  std::vector<int> count(num_hosts, 0);
  for (int h : host_of_rank) ++count[h];
  return std::all_of(count.begin(), count.end(), [&](int c) { return c == count[0]; });
}

}  // namespace hvdtorch
