// Where every rank lives. Built once at init from the host name each rank
// reported (HVDTORCH_HOSTNAME overrides the real one), so that tests can
// emulate several hosts on one machine.
#pragma once

#include <vector>

namespace hvdtorch {

struct Topology {
  int rank = 0;
  int size = 1;
  // host_of_rank[r] is a dense host index (order of first appearance).
  std::vector<int> host_of_rank{0};

  // Derived, filled by build().
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;  // my index among ranks with my local_rank
  int cross_size = 1;  // number of ranks with my local_rank
  int num_hosts = 1;
  std::vector<int> local_ranks;    // global ranks on my host, ascending
  std::vector<int> cross_ranks;    // global ranks with my local_rank, ascending
  std::vector<int> local_rank_of;  // per global rank: its local rank

  static Topology build(int rank, const std::vector<int>& host_of_rank);
  bool sameHost(int peer) const { return host_of_rank[peer] == host_of_rank[rank]; }
  // Same number of ranks on every host (the node reducer needs it).
  bool homogeneous() const;
};

}  // namespace hvdtorch
