// What ops deliver through the engine in the cases test_engine.cc leaves
// open: a grouped all-reduce (always one fused unit) with Average and both
// scale factors, a group whose size differs across ranks, an out-of-place
// broadcast, a reduce to each root, out of place and in place, a cached
// name whose signature changes on one rank, and an allgather repeated under
// one name with different first dimensions.
// Expected values are written out, not recomputed the engine's way.
#include <cmath>
#include <cstring>
#include <string>

#include "check.h"
#include "cluster.h"
#include "common/error.h"
#include "ops/allgather.h"
#include "ops/allreduce.h"
#include "ops/broadcast.h"
#include "ops/reduce.h"

using namespace hvdtorch;
using hvdtorch::test::Cluster;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

bool waitDone(Engine& eng, int64_t h) { return eng.state(h)->waitFor(std::chrono::milliseconds(10000)); }

TensorPtr floats(int64_t n, float value) {
  auto t = std::make_shared<HostTensor>(DataType::kFloat32, std::vector<int64_t>{n});
  for (int64_t i = 0; i < n; ++i) static_cast<float*>(t->data())[i] = value;
  return t;
}

float at(const TensorPtr& t, int64_t i) { return static_cast<const float*>(t->data())[i]; }

// An in-place all-reduce of one float32 tensor (all ones) per entry of `sizes`.
ops::AllreduceOptions grouped(const std::string& name, const std::vector<int64_t>& sizes,
                              ReduceOp op = ReduceOp::kSum) {
  ops::AllreduceOptions o;
  o.name = name;
  o.op = op;
  for (int64_t n : sizes) o.inputs.push_back(floats(n, 1.f));
  o.outputs = o.inputs;
  return o;
}

}  // namespace

TEST(grouped_average_with_scales_gives_each_tensor_its_own_result) {
  // Tensor k, element i on rank r holds (r + 1) * (k + 1) + i. With prescale
  // 2, Average over 3 ranks and postscale 5 every element becomes
  // 2 * (6 (k + 1) + 3 i) / 3 * 5 = 20 (k + 1) + 10 i.
  const int p = 3;
  Cluster c(p);
  c.onEveryRank([&](int r, Engine& eng) {
    ops::AllreduceOptions o = grouped("g", {3, 5, 2}, ReduceOp::kAverage);
    o.prescale = 2.0;
    o.postscale = 5.0;
    for (size_t k = 0; k < o.inputs.size(); ++k)
      for (int64_t i = 0; i < o.inputs[k]->numel(); ++i)
        static_cast<float*>(o.inputs[k]->data())[i] = float((r + 1) * (int(k) + 1) + i);
    const std::vector<TensorPtr> outs = o.outputs;
    const int64_t h = ops::allreduce(eng, std::move(o));
    CHECK(waitDone(eng, h));
    CHECK_MSG(eng.state(h)->error().empty(), "%s", eng.state(h)->error().c_str());
    for (size_t k = 0; k < outs.size(); ++k) {
      for (int64_t i = 0; i < outs[k]->numel(); ++i) {
        const float want = float(20 * (int(k) + 1) + 10 * i);
        const float got = at(outs[k], i);
        CHECK_MSG(std::fabs(got - want) <= 1e-4f * want, "rank %d tensor %zu [%lld]: %g, want %g", r, k,
                  static_cast<long long>(i), double(got), double(want));
      }
    }
  });
}

TEST(group_size_that_differs_across_ranks_is_a_mismatch) {
  for (int fewer : {0, 1}) {
    Cluster c(2);
    std::vector<std::string> errors(2);
    c.onEveryRank([&](int r, Engine& eng) {
      const int64_t h =
          ops::allreduce(eng, grouped("g", r == fewer ? std::vector<int64_t>{4} : std::vector<int64_t>{4, 4}));
      CHECK(waitDone(eng, h));
      errors[r] = eng.state(h)->error();
    });
    const std::string want = fewer == 0 ? "group of 1 tensors vs 2" : "group of 2 tensors vs 1";
    for (int r = 0; r < 2; ++r)
      CHECK_MSG(contains(errors[r], "mismatched allreduce 'g'") && contains(errors[r], want),
                "rank %d (rank %d has fewer): '%s'", r, fewer, errors[r].c_str());
  }
}

TEST(out_of_place_broadcast_sends_the_roots_input) {
  const int p = 3;
  Cluster c(p);
  for (int root = 0; root < p; ++root) {
    c.onEveryRank([&](int r, Engine& eng) {
      ops::BroadcastOptions o;
      o.name = "b" + std::to_string(root);
      o.root = root;
      o.input = floats(4, float(10 * (r + 1)));
      o.output = floats(4, -1.f);
      const TensorPtr in = o.input, out = o.output;
      const int64_t h = ops::broadcast(eng, std::move(o));
      CHECK(waitDone(eng, h));
      CHECK_MSG(eng.state(h)->error().empty(), "%s", eng.state(h)->error().c_str());
      for (int i = 0; i < 4; ++i) {
        CHECK_MSG(at(out, i) == float(10 * (root + 1)), "root %d rank %d: got %g", root, r, double(at(out, i)));
        CHECK(at(in, i) == float(10 * (r + 1)));  // the input is left alone
      }
    });
  }
}

// Rank r gives 10 (r + 1): the root gets 10 + 20 + 30, averaged when so
// asked; every other rank's output is its input, its input left alone.
TEST(reduce_gives_the_root_the_result_and_the_others_their_input) {
  const int p = 3;
  Cluster c(p);
  for (int root = 0; root < p; ++root) {
    for (bool in_place : {false, true}) {
      c.onEveryRank([&](int r, Engine& eng) {
        ops::ReduceOptions o;
        o.name = strCat("r", root, in_place ? ".in" : ".out");
        o.root = root;
        o.op = in_place ? ReduceOp::kAverage : ReduceOp::kSum;
        o.input = floats(4, float(10 * (r + 1)));
        o.output = in_place ? o.input : floats(4, -1.f);
        const TensorPtr in = o.input, out = o.output;
        const int64_t h = ops::reduce(eng, std::move(o));
        CHECK(waitDone(eng, h));
        CHECK_MSG(eng.state(h)->error().empty(), "%s", eng.state(h)->error().c_str());
        const float want = r != root ? float(10 * (r + 1)) : in_place ? 20.f : 60.f;
        for (int i = 0; i < 4; ++i) {
          CHECK_MSG(at(out, i) == want, "root %d rank %d in place %d: got %g want %g", root, r, int(in_place),
                    double(at(out, i)), double(want));
          if (!in_place) CHECK(at(in, i) == float(10 * (r + 1)));  // the input is left alone
        }
      });
    }
  }
}

TEST(cached_name_with_a_new_signature_on_one_rank_is_a_mismatch) {
  Cluster c(2);
  // Negotiated once (and cached), then reused with the same signature.
  for (int iter = 0; iter < 2; ++iter) {
    c.onEveryRank([&](int, Engine& eng) {
      ops::AllreduceOptions o = grouped("x", {4});
      const TensorPtr out = o.outputs[0];
      const int64_t h = ops::allreduce(eng, std::move(o));
      CHECK(waitDone(eng, h));
      CHECK_MSG(eng.state(h)->error().empty(), "%s", eng.state(h)->error().c_str());
      CHECK(at(out, 0) == 2.f);
    });
  }
  // Rank 1 changes the shape under the same name: an error on both ranks.
  std::vector<std::string> errors(2);
  c.onEveryRank([&](int r, Engine& eng) {
    const int64_t h = ops::allreduce(eng, grouped("x", {r == 1 ? 5 : 4}));
    CHECK(waitDone(eng, h));
    errors[r] = eng.state(h)->error();
  });
  for (int r = 0; r < 2; ++r)
    CHECK_MSG(contains(errors[r], "mismatched allreduce 'x'") && contains(errors[r], "shape [4] vs [5]"),
              "rank %d: '%s'", r, errors[r].c_str());
  // Both ranks move to the new shape: renegotiated, then served from the cache again.
  for (int iter = 0; iter < 2; ++iter) {
    c.onEveryRank([&](int, Engine& eng) {
      ops::AllreduceOptions o = grouped("x", {5});
      const TensorPtr out = o.outputs[0];
      const int64_t h = ops::allreduce(eng, std::move(o));
      CHECK(waitDone(eng, h));
      CHECK_MSG(eng.state(h)->error().empty(), "iteration %d: %s", iter, eng.state(h)->error().c_str());
      CHECK(at(out, 4) == 2.f);
    });
  }
}

TEST(allgather_repeated_under_one_name_follows_the_new_first_dimensions) {
  const int p = 3;
  Cluster c(p);
  for (int iter = 0; iter < 4; ++iter) {
    c.onEveryRank([&](int r, Engine& eng) {
      const int64_t rows = (r + iter) % 3;  // changes every call; some ranks send nothing
      auto in = std::make_shared<HostTensor>(DataType::kInt32, std::vector<int64_t>{rows, 2});
      for (int64_t i = 0; i < 2 * rows; ++i) static_cast<int32_t*>(in->data())[i] = int32_t(100 * r + i);
      ops::AllgatherOptions o;
      o.name = "gather";
      o.inputs = {in};
      o.allocate = [](DataType dtype, const std::vector<int64_t>& shape) {
        return std::make_shared<HostTensor>(dtype, shape);
      };
      const int64_t h = ops::allgather(eng, std::move(o));
      CHECK(waitDone(eng, h));
      CHECK_MSG(eng.state(h)->error().empty(), "iteration %d: %s", iter, eng.state(h)->error().c_str());
      if (!eng.state(h)->error().empty()) return;
      const TensorPtr out = eng.state(h)->outputs().at(0);
      std::vector<int32_t> want;
      for (int q = 0; q < p; ++q)
        for (int64_t i = 0; i < 2 * ((q + iter) % 3); ++i) want.push_back(int32_t(100 * q + i));
      CHECK_MSG(out->shape() == (std::vector<int64_t>{static_cast<int64_t>(want.size() / 2), 2}),
                "iteration %d rank %d: %lld rows", iter, r, static_cast<long long>(out->shape()[0]));
      if (out->numel() == static_cast<int64_t>(want.size()))
        CHECK_MSG(std::memcmp(out->data(), want.data(), want.size() * sizeof(int32_t)) == 0,
                  "iteration %d rank %d: wrong rows", iter, r);
    });
  }
}

HVD_TEST_MAIN()
