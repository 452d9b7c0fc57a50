// The response cache on its own: a name is found only with the signature it
// was cached with, a new signature replaces the old one under the same id,
// the capacity is a hard bound (0 disables the cache), and allgather is never
// cached (its first dimensions may change from call to call).
#include <string>

#include "check.h"
#include "engine/response_cache.h"

using namespace hvdtorch;

namespace {

Request allreduce(const std::string& name, int64_t n = 4, ReduceOp op = ReduceOp::kSum) {
  Request q;
  q.type = OpType::kAllreduce;
  q.name = name;
  q.tensors = {{DataType::kFloat32, {n}}};
  ReduceArgs args;
  args.op = op;
  q.args = args;
  return q;
}

}  // namespace

TEST(lookup_needs_the_same_name_and_signature) {
  ResponseCache cache(8);
  cache.put(allreduce("a"));
  cache.put(allreduce("b"));
  CHECK(cache.size() == 2);
  CHECK(cache.lookup(allreduce("a")) == 0 && cache.lookup(allreduce("b")) == 1);
  CHECK(cache.lookup(allreduce("c")) == -1);
  CHECK_MSG(cache.lookup(allreduce("a", 5)) == -1, "a new shape under a cached name was taken for the old one");
  CHECK(cache.lookup(allreduce("a", 4, ReduceOp::kMax)) == -1);
  Request scaled = allreduce("a");
  std::get<ReduceArgs>(scaled.args).postscale = 0.5;
  CHECK(cache.lookup(scaled) == -1);
  // idOf ignores the signature.
  CHECK(cache.idOf("a") == 0 && cache.idOf("c") == -1);
}

TEST(new_signature_replaces_the_old_one_under_the_same_id) {
  ResponseCache cache(8);
  cache.put(allreduce("a"));
  cache.put(allreduce("b"));
  cache.put(allreduce("a", 7));
  CHECK(cache.size() == 2);
  CHECK_MSG(cache.lookup(allreduce("a", 7)) == 0, "renegotiated signature not cached");
  CHECK(cache.lookup(allreduce("a", 4)) == -1);
  CHECK(cache.at(0).tensors[0].shape == std::vector<int64_t>{7});
  CHECK(cache.lookup(allreduce("b")) == 1);
}

TEST(capacity_bounds_the_cache_and_zero_disables_it) {
  ResponseCache cache(2);
  cache.put(allreduce("a"));
  cache.put(allreduce("b"));
  cache.put(allreduce("c"));
  CHECK_MSG(cache.size() == 2, "size %zu with capacity 2", cache.size());
  CHECK(cache.lookup(allreduce("c")) == -1);
  // A full cache still replaces signatures of names it holds.
  cache.put(allreduce("b", 9));
  CHECK(cache.lookup(allreduce("b", 9)) == 1);

  ResponseCache off(0);
  off.put(allreduce("a"));
  CHECK_MSG(off.size() == 0 && off.lookup(allreduce("a")) == -1, "capacity 0 cached %zu entries", off.size());
  CHECK(off.words() == 0);
}

TEST(allgather_is_never_cached) {
  ResponseCache cache(8);
  Request g;
  g.type = OpType::kAllgather;
  g.name = "g";
  g.tensors = {{DataType::kFloat32, {3, 2}}};
  cache.put(g);
  CHECK(cache.size() == 0 && cache.lookup(g) == -1);
  Request b = allreduce("b");
  b.type = OpType::kBroadcast;
  b.args = BroadcastArgs{0};
  Request barrier;
  barrier.type = OpType::kBarrier;
  barrier.name = "barrier.0";
  cache.put(b);
  cache.put(barrier);
  CHECK(cache.size() == 2);
}

TEST(bit_vector_words_follow_the_size) {
  ResponseCache cache(200);
  for (int i = 0; i < 64; ++i) cache.put(allreduce("t" + std::to_string(i)));
  CHECK(cache.words() == 1);
  cache.put(allreduce("t64"));
  CHECK(cache.words() == 2 && cache.idOf("t64") == 64);
}

HVD_TEST_MAIN()
