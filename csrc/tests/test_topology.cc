#include "check.h"
#include "transport/topology.h"

using namespace hvdtorch;

TEST(two_by_two) {
  // Ranks 0,1 on host 0; ranks 2,3 on host 1.
  const std::vector<int> hosts = {0, 0, 1, 1};
  Topology t = Topology::build(3, hosts);
  CHECK(t.local_rank == 1 && t.local_size == 2);
  CHECK(t.cross_rank == 1 && t.cross_size == 2);
  CHECK((t.cross_ranks == std::vector<int>{1, 3}));
  CHECK((t.local_ranks == std::vector<int>{2, 3}));
  CHECK(t.homogeneous() && t.num_hosts == 2);
}

TEST(interleaved_and_uneven) {
  const std::vector<int> hosts = {0, 1, 0, 1, 0};
  Topology t = Topology::build(4, hosts);
  CHECK(t.local_rank == 2 && t.local_size == 3);
  CHECK(t.cross_size == 1 && t.cross_rank == 0);
  CHECK(!t.homogeneous());
  Topology u = Topology::build(1, hosts);
  CHECK(u.local_rank == 0 && u.cross_rank == 1 && u.cross_size == 2);
}

HVD_TEST_MAIN()
