// The per-op entry functions (csrc/core/ops) end to end on in-process ranks:
// alltoall (even and uneven splits, received splits), reduce-scatter (single,
// grouped over two dtypes, again through the response cache), grouped
// allgather, and every local check -- which must throw InvalidArgument
// naming the rank and op before anything is sent, leaving the ranks in step.
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/reducer_registry.h"
#include "check.h"
#include "cluster.h"
#include "common/error.h"
#include "ops/allgather.h"
#include "ops/allreduce.h"
#include "ops/alltoall.h"
#include "ops/barrier.h"
#include "ops/broadcast.h"
#include "ops/op_common.h"
#include "ops/reducescatter.h"

using namespace hvdtorch;
using hvdtorch::test::Cluster;

namespace {

template <typename T>
TensorPtr tensorOf(DataType dtype, std::vector<int64_t> shape, const std::function<T(int64_t)>& f) {
  auto t = std::make_shared<HostTensor>(dtype, std::move(shape));
  for (int64_t i = 0; i < t->numel(); ++i) static_cast<T*>(t->data())[i] = f(i);
  return t;
}

TensorPtr floats(std::vector<int64_t> shape, const std::function<float(int64_t)>& f) {
  return tensorOf<float>(DataType::kFloat32, std::move(shape), f);
}

OutputAllocator hostAllocator() {
  return [](DataType dtype, const std::vector<int64_t>& shape) { return std::make_shared<HostTensor>(dtype, shape); };
}

// Waits for the op and returns its outputs; records its error, if any, as a failure.
std::vector<TensorPtr> finish(Engine& eng, int64_t h) {
  auto st = eng.state(h);
  CHECK(st->waitFor(std::chrono::milliseconds(10000)));
  CHECK_MSG(st->error().empty(), "%s", st->error().c_str());
  std::vector<TensorPtr> out = st->outputs();
  eng.release(h);
  return out;
}

template <typename T>
std::vector<T> contents(const TensorPtr& t) {
  const T* p = static_cast<const T*>(t->data());
  return std::vector<T>(p, p + t->numel());
}

// Runs `call` and checks it throws InvalidArgument whose message holds every one of `words`.
void expectInvalid(const std::function<void()>& call, const std::vector<std::string>& words) {
  std::string what;
  try {
    call();
  } catch (const InvalidArgument& e) {
    what = e.what();
  }
  CHECK_MSG(!what.empty(), "no InvalidArgument (wanted '%s')", words.empty() ? "" : words[0].c_str());
  for (const auto& w : words) CHECK_MSG(what.find(w) != std::string::npos, "'%s' not in: %s", w.c_str(), what.c_str());
}

}  // namespace

TEST(alltoall_uneven_and_even) {
  const int p = 3;
  Cluster c(p);
  c.onEveryRank([&](int r, Engine& eng) {
    // Rank r sends (r + d) % 3 rows of 2 floats to rank d; value = 100 r + 10 d + row-in-block.
    std::vector<int64_t> splits(p);
    int64_t rows = 0;
    for (int d = 0; d < p; ++d) rows += splits[d] = (r + d) % 3;
    std::vector<float> in;
    for (int d = 0; d < p; ++d)
      for (int64_t k = 0; k < splits[d]; ++k) in.insert(in.end(), 2, float(100 * r + 10 * d + k));
    ops::AlltoallOptions o;
    o.name = "a2a";
    o.input = floats({rows, 2}, [&](int64_t i) { return in[i]; });
    o.splits = splits;
    o.allocate = hostAllocator();
    auto outs = finish(eng, ops::alltoall(eng, std::move(o)));
    CHECK(outs.size() == 2);
    std::vector<float> want;
    std::vector<int64_t> received;
    for (int s = 0; s < p; ++s) {
      received.push_back((s + r) % 3);
      for (int64_t k = 0; k < received.back(); ++k) want.insert(want.end(), 2, float(100 * s + 10 * r + k));
    }
    CHECK(contents<float>(outs[0]) == want);
    CHECK(outs[0]->shape() == (std::vector<int64_t>{static_cast<int64_t>(want.size() / 2), 2}));
    CHECK(outs[1]->dtype() == DataType::kInt64 && contents<int64_t>(outs[1]) == received);

    // No splits: dimension 0 divided evenly.
    ops::AlltoallOptions even;
    even.name = "a2a.even";
    even.input = floats({2 * p}, [&](int64_t i) { return float(10 * r + i); });
    even.allocate = hostAllocator();
    outs = finish(eng, ops::alltoall(eng, std::move(even)));
    std::vector<float> want_even;
    for (int s = 0; s < p; ++s) want_even.insert(want_even.end(), {float(10 * s + 2 * r), float(10 * s + 2 * r + 1)});
    CHECK(contents<float>(outs[0]) == want_even);
  });
}

TEST(reducescatter_uneven_grouped_and_cached) {
  const int p = 3;
  Cluster c(p);
  c.onEveryRank([&](int r, Engine& eng) {
    for (int iter = 0; iter < 3; ++iter) {  // iterations >= 1 come from the response cache
      ops::ReducescatterOptions o;
      o.name = "rs";
      // 7 rows of 2: ranks keep 3, 2, 2 rows. A second tensor of another dtype.
      o.inputs = {floats({7, 2}, [&](int64_t i) { return float(i + r); }),
                  tensorOf<int32_t>(DataType::kInt32, {4}, [&](int64_t i) { return int32_t(i * (r + 1)); })};
      o.op = ReduceOp::kSum;
      o.postscale = 0.5;
      o.allocate = hostAllocator();
      auto outs = finish(eng, ops::reducescatter(eng, std::move(o)));
      const int64_t rows[3] = {3, 2, 2}, first[3] = {0, 3, 5};
      CHECK(outs[0]->shape() == (std::vector<int64_t>{rows[r], 2}));
      const auto got = contents<float>(outs[0]);
      for (int64_t i = 0; i < rows[r] * 2; ++i) {
        const int64_t at = first[r] * 2 + i;
        CHECK_MSG(got[i] == 0.5f * float(3 * at + 0 + 1 + 2), "iter %d rank %d [%ld] = %g", iter, r, long(i), got[i]);
      }
      // 4 int32 rows: ranks keep 2, 1, 1; sum of i * (1 + 2 + 3) = 6 i, halved.
      const int64_t irows[3] = {2, 1, 1}, ifirst[3] = {0, 2, 3};
      const auto gi = contents<int32_t>(outs[1]);
      CHECK(static_cast<int64_t>(gi.size()) == irows[r]);
      for (int64_t i = 0; i < irows[r]; ++i) CHECK(gi[i] == 3 * (ifirst[r] + i));
    }
  });
}

TEST(grouped_allgather) {
  const int p = 3;
  Cluster c(p);
  c.onEveryRank([&](int r, Engine& eng) {
    ops::AllgatherOptions o;
    o.name = "gag";
    o.inputs = {floats({r, 2}, [&](int64_t i) { return float(100 * r + i); }),
                tensorOf<int64_t>(DataType::kInt64, {1}, [&](int64_t) { return int64_t(r); })};
    o.allocate = hostAllocator();
    auto outs = finish(eng, ops::allgather(eng, std::move(o)));
    CHECK(outs.size() == 2);
    CHECK(contents<float>(outs[0]) == (std::vector<float>{100, 101, 200, 201, 202, 203}));
    CHECK(contents<int64_t>(outs[1]) == (std::vector<int64_t>{0, 1, 2}));
  });
}

TEST(average_divides_by_the_size_after_the_postscale_is_kept) {
  const int p = 2;
  Cluster c(p);
  c.onEveryRank([&](int r, Engine& eng) {
    ops::AllreduceOptions o;
    o.name = "avg";
    auto t = floats({3}, [&](int64_t) { return float(2 * r + 1); });
    o.inputs = {t};
    o.outputs = {t};
    o.postscale = 3.0;
    const ReduceArgs args = ops::allreduceArgs(eng, o);
    CHECK(args.op == ReduceOp::kAverage && args.postscale == 3.0 && args.reducer == kAutoReducer);
    finish(eng, ops::allreduce(eng, std::move(o)));
    CHECK(contents<float>(t) == std::vector<float>(3, 3.0f * (1 + 3) / 2));
  });
}

TEST(local_checks_name_rank_and_op_and_send_nothing) {
  const int p = 2;
  Cluster c(p);
  c.onEveryRank([&](int r, Engine& eng) {
    const std::string me = strCat("rank ", r, ": ");
    auto a2a = [&](std::vector<int64_t> shape, std::vector<int64_t> splits) {
      ops::AlltoallOptions o;
      o.name = "x";
      o.input = floats(std::move(shape), [](int64_t) { return 0.f; });
      o.splits = std::move(splits);
      o.allocate = hostAllocator();
      ops::alltoall(eng, std::move(o));
    };
    expectInvalid([&] { a2a({3}, {1, 1}); }, {me + "alltoall 'x'", "sum to 2", "first dimension 3"});
    expectInvalid([&] { a2a({3}, {1, 1, 1}); }, {me + "alltoall 'x'", "one per rank"});
    expectInvalid([&] { a2a({1}, {2, -1}); }, {me, "negative"});
    expectInvalid([&] { a2a({3}, {}); }, {me, "not a multiple of the number of ranks 2"});
    expectInvalid([&] { a2a({}, {}); }, {me, "at least one dimension"});

    auto rs = [&](std::vector<int64_t> shape, DataType dtype, ReduceOp op, double pre) {
      ops::ReducescatterOptions o;
      o.name = "y";
      o.inputs = {std::make_shared<HostTensor>(dtype, std::move(shape))};
      o.op = op;
      o.prescale = pre;
      o.allocate = hostAllocator();
      ops::reducescatter(eng, std::move(o));
    };
    expectInvalid([&] { rs({}, DataType::kFloat32, ReduceOp::kSum, 1.0); }, {me + "reducescatter 'y'", "dimension"});
    expectInvalid([&] { rs({2}, DataType::kBool, ReduceOp::kAverage, 1.0); }, {me, "Average is not defined for bool"});
    expectInvalid([&] { rs({2}, DataType::kBool, ReduceOp::kMax, 2.0); }, {me, "scale factors"});
    expectInvalid([&] { rs({2}, DataType::kFloat32, ReduceOp::kAdasum, 1.0); }, {me, "Adasum"});

    auto ar = [&](const std::string& reducer, int32_t set) {
      ops::AllreduceOptions o;
      o.name = "z";
      auto t = floats({2}, [](int64_t) { return 1.f; });
      o.inputs = {t};
      o.outputs = {t};
      o.reducer = reducer;
      o.process_set_id = set;
      ops::allreduce(eng, std::move(o));
    };
    std::vector<std::string> unknown = {me + "allreduce 'z'", "unknown reducer 'bogus'"};
    for (const ReducerEntry& e : reducerRegistry()) unknown.emplace_back(e.name);  // the message lists them all
    expectInvalid([&] { ar("bogus", 0); }, unknown);
    // A reducer this job cannot run (the cluster has no shared memory): the registry's reason.
    for (const ReducerEntry& e : reducerRegistry())
      if (*e.unavailable != '\0') expectInvalid([&] { ar(e.name, 0); }, {me + "allreduce 'z'", e.unavailable});
    expectInvalid([&] { ar("", 3); }, {me, "process set 3"});
    expectInvalid([] { ops::toReduceOp(6); }, {"unknown reduce op 6"});

    // The entry builder's checks (ops/op_common.h): a list of row blocks
    // needs a tensor, an op whose row allocates its outputs an allocator.
    auto ag = [&](bool tensor, bool allocate) {
      ops::AllgatherOptions o;
      o.name = "v";
      if (tensor) o.inputs = {floats({2}, [](int64_t) { return 0.f; })};
      if (allocate) o.allocate = hostAllocator();
      ops::allgather(eng, std::move(o));
    };
    expectInvalid([&] { ag(false, true); }, {me + "allgather 'v'", "needs at least one tensor"});
    expectInvalid([&] { ag(true, false); }, {me + "allgather 'v'", "needs an output allocator"});

    ops::BroadcastOptions b;
    b.name = "w";
    b.input = floats({1}, [](int64_t) { return 0.f; });
    b.output = b.input;
    b.root = p;
    expectInvalid([&] { ops::broadcast(eng, std::move(b)); }, {me + "broadcast 'w'", "root_rank 2"});

    // Nothing was submitted: the ranks are still in step.
    finish(eng, ops::barrier(eng, ops::BarrierOptions{"after"}));
  });
}

HVD_TEST_MAIN()
