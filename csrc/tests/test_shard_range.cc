// The shard rule (gradients/shard_range.h): ranges tile the bucket in rank
// order, differ in size by at most one, and are the rows reduce-scatter
// gives each rank.
#include "check.h"
#include "common/error.h"
#include "gradients/shard_range.h"
#include "ops/reducescatter.h"

using namespace hvdtorch;

TEST(ranges_tile_the_bucket_as_reducescatter_splits_it) {
  for (int size = 1; size <= 9; ++size) {
    for (int64_t numel = 0; numel <= 40; ++numel) {
      int64_t next = 0;
      for (int rank = 0; rank < size; ++rank) {
        const ShardRange r = shardRange(numel, rank, size);
        CHECK(r.start == next);
        CHECK(r.end >= r.start);
        CHECK(r.end - r.start == ops::reducescatterRows(numel, size, rank));
        next = r.end;
      }
      CHECK(next == numel);
    }
  }
}

TEST(uneven_ranges_and_refusals) {
  // 10 elements over 4 ranks: 3, 3, 2, 2.
  CHECK(shardRange(10, 1, 4).start == 3 && shardRange(10, 1, 4).end == 6);
  CHECK(shardRange(10, 3, 4).start == 8 && shardRange(10, 3, 4).end == 10);
  CHECK_THROWS(shardRange(10, 4, 4), InvalidArgument);
  CHECK_THROWS(shardRange(10, -1, 4), InvalidArgument);
  CHECK_THROWS(shardRange(-1, 0, 1), InvalidArgument);
}

HVD_TEST_MAIN()
