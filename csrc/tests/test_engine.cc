// The engine end to end, with p in-process ranks: negotiation of ops
// submitted in different orders on different ranks, the response cache's fast
// path, fusion, mismatch errors on every rank, duplicate names, allgather with
// uneven first dimensions, broadcast, and shutdown.
#include <atomic>
#include <barrier>
#include <thread>

#include "check.h"
#include "cluster.h"
#include "common/error.h"
#include "engine/engine.h"

using namespace hvdtorch;
using hvdtorch::test::Cluster;

namespace {

EntryPtr allreduceEntry(const std::string& name, std::vector<int64_t> shape, float value,
                        ReduceOp op = ReduceOp::kSum, double postscale = 1.0) {
  auto e = std::make_shared<Entry>();
  e->request.type = OpType::kAllreduce;
  e->request.name = name;
  e->request.tensors = {{DataType::kFloat32, shape}};
  ReduceArgs args;
  args.op = op;
  args.postscale = postscale;
  e->request.args = args;
  auto t = std::make_shared<HostTensor>(DataType::kFloat32, shape);
  for (int64_t i = 0; i < t->numel(); ++i) static_cast<float*>(t->data())[i] = value;
  e->inputs = {t};
  e->outputs = {t};
  return e;
}

float first(const EntryPtr& e) { return static_cast<float*>(e->outputs[0]->data())[0]; }

bool waitDone(Engine& eng, int64_t h) { return eng.state(h)->waitFor(std::chrono::milliseconds(10000)); }

}  // namespace

TEST(out_of_order_submission_and_cache) {
  const int p = 3;
  Cluster c(p);
  for (int iter = 0; iter < 5; ++iter) {  // iterations >= 1 hit the response cache
    c.onEveryRank([&](int r, Engine& eng) {
      std::vector<EntryPtr> es;
      std::vector<int64_t> hs;
      for (int k = 0; k < 6; ++k) {
        // Rank r submits in a rotated order: negotiation must match by name.
        const int j = (k + r) % 6;
        es.push_back(allreduceEntry("t" + std::to_string(j), {j + 1, 3}, float(r + j), ReduceOp::kSum, 0.5));
        hs.push_back(eng.submit(es.back()));
      }
      for (int k = 0; k < 6; ++k) {
        CHECK(waitDone(eng, hs[k]));
        CHECK_MSG(eng.state(hs[k])->error().empty(), "%s", eng.state(hs[k])->error().c_str());
        const int j = (k + r) % 6;
        const float want = 0.5f * float(0 + 1 + 2 + 3 * j);
        CHECK_MSG(first(es[k]) == want, "iter %d rank %d t%d: %g vs %g", iter, r, j, first(es[k]), want);
        eng.release(hs[k]);
      }
    });
  }
}

TEST(mismatch_fails_on_every_rank_and_engine_goes_on) {
  const int p = 3;
  Cluster c(p);
  std::vector<std::string> errors(p);
  c.onEveryRank([&](int r, Engine& eng) {
    auto e = allreduceEntry("x", {r == 2 ? 5 : 4}, 1.f);
    const int64_t h = eng.submit(e);
    CHECK(waitDone(eng, h));
    errors[r] = eng.state(h)->error();
    // The engine still works afterwards.
    auto ok = allreduceEntry("y", {2}, 1.f);
    const int64_t h2 = eng.submit(ok);
    CHECK(waitDone(eng, h2));
    CHECK(eng.state(h2)->error().empty());
    CHECK(first(ok) == 3.f);
  });
  for (int r = 0; r < p; ++r) {
    CHECK_MSG(errors[r].find("mismatched allreduce 'x'") != std::string::npos, "rank %d: %s", r, errors[r].c_str());
    CHECK(errors[r].find("ranks [0, 1]") != std::string::npos);
    CHECK(errors[r].find("ranks [2]") != std::string::npos);
  }
}

TEST(duplicate_pending_name_is_rejected_locally) {
  Cluster c(2);
  auto a = allreduceEntry("dup", {1}, 1.f);
  c.engines[0]->submit(a);
  CHECK_THROWS(c.engines[0]->submit(allreduceEntry("dup", {1}, 1.f)), InvalidArgument);
  // Let rank 1 complete it so shutdown is clean.
  auto b = allreduceEntry("dup", {1}, 1.f);
  const int64_t h = c.engines[1]->submit(b);
  CHECK(waitDone(*c.engines[1], h));
}

TEST(missing_rank_times_out_with_names) {
  Config cfg;
  cfg.stall_warning = std::chrono::milliseconds(100);
  Cluster c(3, cfg);
  // Override after construction is not possible; the cluster's timeout is 5 s.
  auto e0 = allreduceEntry("lonely", {1}, 1.f);
  auto e1 = allreduceEntry("lonely", {1}, 1.f);
  const int64_t h0 = c.engines[0]->submit(e0);
  const int64_t h1 = c.engines[1]->submit(e1);
  CHECK(waitDone(*c.engines[0], h0));
  CHECK(waitDone(*c.engines[1], h1));
  const std::string err = c.engines[0]->state(h0)->error();
  CHECK_MSG(err.find("ranks [2] did not submit it") != std::string::npos, "%s", err.c_str());
  CHECK(c.engines[1]->state(h1)->error() == err);
}

TEST(allgather_uneven_and_broadcast) {
  const int p = 3;
  Cluster c(p);
  c.onEveryRank([&](int r, Engine& eng) {
    auto g = std::make_shared<Entry>();
    g->request.type = OpType::kAllgather;
    g->request.name = "g";
    g->request.tensors = {{DataType::kInt32, {r, 2}}};  // rank 0 contributes no rows
    auto in = std::make_shared<HostTensor>(DataType::kInt32, std::vector<int64_t>{r, 2});
    for (int i = 0; i < 2 * r; ++i) static_cast<int32_t*>(in->data())[i] = r * 100 + i;
    g->inputs = {in};
    g->allocate = [](DataType dtype, const std::vector<int64_t>& shape) {
      return std::make_shared<HostTensor>(dtype, shape);
    };
    const int64_t h = eng.submit(g);

    auto b = std::make_shared<Entry>();
    b->request.type = OpType::kBroadcast;
    b->request.name = "b";
    b->request.args = BroadcastArgs{1};
    b->request.tensors = {{DataType::kFloat64, {3}}};
    auto bt = std::make_shared<HostTensor>(DataType::kFloat64, std::vector<int64_t>{3});
    for (int i = 0; i < 3; ++i) static_cast<double*>(bt->data())[i] = r * 10 + i;
    b->inputs = {bt};
    b->outputs = {bt};
    const int64_t hb = eng.submit(b);

    CHECK(waitDone(eng, h));
    CHECK_MSG(eng.state(h)->error().empty(), "%s", eng.state(h)->error().c_str());
    const auto& out = eng.state(h)->outputs();
    CHECK(out.size() == 1 && out[0]->shape() == (std::vector<int64_t>{0 + 1 + 2, 2}));
    const int32_t* o = static_cast<const int32_t*>(out[0]->data());
    CHECK(o[0] == 100 && o[1] == 101 && o[2] == 200 && o[5] == 203);
    CHECK(waitDone(eng, hb));
    for (int i = 0; i < 3; ++i) CHECK(static_cast<double*>(bt->data())[i] == 10 + i);
  });
}

TEST(fusion_of_many_small_tensors) {
  Config cfg;
  cfg.fusion_threshold = 1000;  // forces several fused units
  const int p = 2;
  Cluster c(p, cfg);
  c.onEveryRank([&](int r, Engine& eng) {
    std::vector<EntryPtr> es;
    std::vector<int64_t> hs;
    for (int k = 0; k < 40; ++k) {
      es.push_back(allreduceEntry("f" + std::to_string(k), {k % 7 + 1, 5}, float(k + r)));
      hs.push_back(eng.submit(es.back()));
    }
    for (int k = 0; k < 40; ++k) {
      CHECK(waitDone(eng, hs[k]));
      CHECK(first(es[k]) == float(2 * k + 1));
    }
  });
}

TEST(shutdown_fails_pending_and_rejects_new) {
  Cluster c(2);
  auto e = allreduceEntry("never", {1}, 1.f);
  const int64_t h = c.engines[0]->submit(e);
  c.engines[1]->shutdown();
  CHECK(waitDone(*c.engines[0], h));
  const std::string err = c.engines[0]->state(h)->error();
  CHECK_MSG(err.find("shut down") != std::string::npos && err.find("rank 1") != std::string::npos, "%s", err.c_str());
  bool threw = false;
  for (int i = 0; i < 100 && !threw; ++i) {
    try {
      c.engines[0]->submit(allreduceEntry("late", {1}, 1.f));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } catch (const CollectiveError&) {
      threw = true;
    } catch (const InvalidArgument&) {
    }
  }
  CHECK(threw);
}

HVD_TEST_MAIN()
