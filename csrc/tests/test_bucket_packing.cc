// The packing rule (gradients/bucket_packing.h): parameters follow each
// other in order with no gap; empty parameters take no room.
#include "check.h"
#include "common/error.h"
#include "gradients/bucket_packing.h"

using namespace hvdtorch;

TEST(parameters_follow_each_other_without_gaps) {
  const BucketPacking p = packBucket({3, 0, 4, 1});
  CHECK(p.offsets == (std::vector<int64_t>{0, 3, 3, 7}));
  CHECK(p.numel == 8);
  CHECK(packBucket({}).numel == 0 && packBucket({}).offsets.empty());
  CHECK_THROWS(packBucket({2, -1}), InvalidArgument);
}

HVD_TEST_MAIN()
