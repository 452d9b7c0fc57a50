// The engine end to end, with p in-process ranks: negotiation of ops
// submitted in different orders on different ranks, the response cache's fast
// path, fusion, mismatch errors on every rank, duplicate names, allgather with
// uneven first dimensions, broadcast, and shutdown.
#include <atomic>
#include <barrier>
#include <cstring>
#include <thread>

#include "algorithms/reducer_registry.h"
#include "check.h"
#include "cluster.h"
#include "common/error.h"
#include "engine/engine.h"

using namespace hvdtorch;
using hvdtorch::test::Cluster;

namespace {

EntryPtr allreduceEntry(const std::string& name, std::vector<int64_t> shape, float value, ReduceOp op = ReduceOp::kSum,
                        double postscale = 1.0) {
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

// An entry of any op, with every signature field settable, for the mismatch
// table. Inputs are zeros; allgather allocates its output.
struct Spec {
  OpType type = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape{4};
  ReduceOp op = ReduceOp::kSum;
  int32_t root = 0;
  double prescale = 1.0, postscale = 1.0;
  ReducerId reducer = kAutoReducer;
  bool fuse = true;
};

EntryPtr entryOf(const std::string& name, const Spec& s) {
  auto e = std::make_shared<Entry>();
  Request& q = e->request;
  q.type = s.type;
  q.name = name;
  if (s.type == OpType::kAllreduce) q.args = ReduceArgs{s.op, s.prescale, s.postscale, s.reducer, s.fuse};
  if (s.type == OpType::kBroadcast) q.args = BroadcastArgs{s.root};
  if (s.type == OpType::kBarrier) return e;
  q.tensors = {{s.dtype, s.shape}};
  auto t = std::make_shared<HostTensor>(s.dtype, s.shape);
  std::memset(t->data(), 0, t->bytes());
  e->inputs = {t};
  if (s.type == OpType::kAllgather) {
    e->allocate = [](DataType dt, const std::vector<int64_t>& shape) {
      return std::make_shared<HostTensor>(dt, shape);
    };
  } else {
    e->outputs = {t};
  }
  return e;
}

template <typename T>
EntryPtr typedAllreduce(const std::string& name, DataType dt, const std::vector<T>& values, ReduceOp op,
                        double prescale = 1.0, double postscale = 1.0) {
  Spec s;
  s.dtype = dt;
  s.shape = {static_cast<int64_t>(values.size())};
  s.op = op;
  s.prescale = prescale;
  s.postscale = postscale;
  EntryPtr e = entryOf(name, s);
  std::memcpy(e->inputs[0]->data(), values.data(), values.size() * sizeof(T));
  return e;
}

template <typename T>
std::vector<T> valuesOf(const EntryPtr& e) {
  const T* p = static_cast<const T*>(e->outputs[0]->data());
  return std::vector<T>(p, p + e->outputs[0]->numel());
}

// A buffer that, once armed, blocks the first thread that asks for its data
// (the engine's executor) until opened: it holds an op "running".
class GateTensor : public HostTensor {
 public:
  using HostTensor::HostTensor;
  void* data() override {
    if (armed.exchange(false)) {
      entered = true;
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(10), [&] { return open_; });
    }
    return HostTensor::data();
  }
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  std::atomic<bool> armed{false};
  std::atomic<bool> entered{false};

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

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

TEST(name_stays_taken_until_the_op_finishes) {
  Cluster c(2);
  auto gate = std::make_shared<GateTensor>(DataType::kFloat32, std::vector<int64_t>{4});
  for (int i = 0; i < 4; ++i) static_cast<float*>(gate->HostTensor::data())[i] = 1.f;
  auto held = allreduceEntry("x", {4}, 1.f);
  held->inputs = {gate};
  held->outputs = {gate};
  gate->armed = true;
  const int64_t h0 = c.engines[0]->submit(held);
  const int64_t h1 = c.engines[1]->submit(allreduceEntry("x", {4}, 1.f));
  for (int i = 0; i < 1000 && !gate->entered; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(gate->entered);  // negotiated, and now running on rank 0
  // Negotiated is not finished: the name is still taken.
  CHECK_THROWS(c.engines[0]->submit(allreduceEntry("x", {4}, 1.f)), InvalidArgument);
  gate->open();
  CHECK(waitDone(*c.engines[0], h0));
  CHECK(waitDone(*c.engines[1], h1));
  CHECK(first(held) == 2.f);
  // Finished: the name is free again the moment wait returns.
  c.onEveryRank([&](int, Engine& eng) {
    auto again = allreduceEntry("x", {4}, 1.f);
    const int64_t h = eng.submit(again);
    CHECK(waitDone(eng, h));
    CHECK_MSG(eng.state(h)->error().empty(), "%s", eng.state(h)->error().c_str());
  });
}

TEST(integer_average_is_exact_division) {
  // References are exact integers written out, not the engine's arithmetic.
  const int64_t big = (int64_t(1) << 53) + 1;
  {
    Cluster c(2);
    c.onEveryRank([&](int r, Engine& eng) {
      auto e = typedAllreduce<int64_t>("big", DataType::kInt64, {big, -big, r == 0 ? -7 : 2, 5}, ReduceOp::kAverage);
      const int64_t h = eng.submit(e);
      CHECK(waitDone(eng, h));
      const auto got = valuesOf<int64_t>(e);
      // (-7 + 2) / 2 truncates toward zero: -2, not -3; 10 / 2 = 5.
      CHECK_MSG(got == (std::vector<int64_t>{big, -big, -2, 5}), "rank %d: %lld %lld %lld %lld", r,
                static_cast<long long>(got[0]), static_cast<long long>(got[1]), static_cast<long long>(got[2]),
                static_cast<long long>(got[3]));
    });
  }
  {
    // Pre- and postscale on integers, where their order shows: each rank's
    // 3 or 5 is prescaled by 0.5 first (1 and 2, truncated), summed (3),
    // averaged exactly (1), then postscaled by 3: 3. Scaling the sum instead
    // would give (8 * 0.5 / 2) * 3 = 6.
    Cluster c(2);
    c.onEveryRank([&](int r, Engine& eng) {
      auto e = typedAllreduce<int32_t>("scaled", DataType::kInt32, {r == 0 ? 3 : 5}, ReduceOp::kAverage, 0.5, 3.0);
      const int64_t h = eng.submit(e);
      CHECK(waitDone(eng, h));
      CHECK_MSG(valuesOf<int32_t>(e)[0] == 3, "rank %d: got %d", r, valuesOf<int32_t>(e)[0]);
    });
  }
}

TEST(float_average_applies_user_postscale_and_prescale) {
  // Ranks hold 1, 2, 3: Average with prescale 2 and postscale 5 is
  // (2 + 4 + 6) / 3 * 5 = 20. Ignoring the postscale gives 4; ignoring the
  // division gives 60; ignoring the prescale gives 10. Fused and unfused.
  for (bool fuse : {false, true}) {
    Cluster c(3);
    c.onEveryRank([&](int r, Engine& eng) {
      std::vector<EntryPtr> es;
      std::vector<int64_t> hs;
      for (int k = 0; k < 3; ++k) {
        Spec s;
        s.shape = {3};
        s.op = ReduceOp::kAverage;
        s.prescale = 2.0;
        s.postscale = 5.0;
        s.fuse = fuse;
        es.push_back(entryOf("avg" + std::to_string(k), s));
        for (int i = 0; i < 3; ++i) static_cast<float*>(es.back()->inputs[0]->data())[i] = float(r + 1);
        hs.push_back(eng.submit(es.back()));
      }
      for (int k = 0; k < 3; ++k) {
        CHECK(waitDone(eng, hs[k]));
        CHECK_MSG(first(es[k]) == 20.f, "fuse=%d rank %d op %d: got %g", int(fuse), r, k, double(first(es[k])));
      }
    });
  }
}

TEST(every_mismatch_fails_on_every_rank_naming_both_sides) {
  // Rank 1 differs from rank 0 in exactly one signature field per case. Every
  // rank must get the error, which says what differs and what each side sent.
  struct Case {
    const char* what;  // must appear in the message
    Spec a, b;
    const char* a_says;  // must appear: rank 0's side, as describe() prints it
    const char* b_says;  // rank 1's side
  };
  std::vector<Case> cases;
  auto add = [&](const char* what, auto change, const char* a_says, const char* b_says, Spec base = {}) {
    Spec b = base;
    change(b);
    cases.push_back({what, base, b, a_says, b_says});
  };
  add("dtype float32 vs float64", [](Spec& s) { s.dtype = DataType::kFloat64; }, "float32 [4]", "float64 [4]");
  add("shape [4] vs [5]", [](Spec& s) { s.shape = {5}; }, "float32 [4]", "float32 [5]");
  add("reduce op Sum vs Max", [](Spec& s) { s.op = ReduceOp::kMax; }, "Sum", "Max");
  add("reduce op Sum vs Average", [](Spec& s) { s.op = ReduceOp::kAverage; }, "Sum", "Average");
  add(
      "scale factors (prescale 1, postscale 1) vs (prescale 2, postscale 1)", [](Spec& s) { s.prescale = 2; },
      "ranks [0]", "ranks [1]");
  add(
      "scale factors (prescale 1, postscale 1) vs (prescale 1, postscale 0.5)", [](Spec& s) { s.postscale = 0.5; },
      "ranks [0]", "ranks [1]");
  add("reducer auto vs ring", [](Spec& s) { s.reducer = parseReducer("ring"); }, "ranks [0]", "ranks [1]");
  add("fusion on vs off", [](Spec& s) { s.fuse = false; }, "ranks [0]", "ranks [1]");
  add("operation allreduce vs broadcast", [](Spec& s) { s.type = OpType::kBroadcast; }, "allreduce 'm", "broadcast 'm");
  Spec bcast;
  bcast.type = OpType::kBroadcast;
  add("root rank 0 vs 1", [](Spec& s) { s.root = 1; }, "root 0", "root 1", bcast);
  Spec gather;
  gather.type = OpType::kAllgather;
  gather.shape = {2, 3};
  add("shape [2, 3] vs [2, 4]", [](Spec& s) { s.shape = {2, 4}; }, "int", "int", gather);
  cases.back().a_says = "float32 [2, 3]";
  cases.back().b_says = "float32 [2, 4]";

  Cluster c(2);
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& cs = cases[k];
    const std::string name = "m" + std::to_string(k);
    std::vector<std::string> errors(2);
    c.onEveryRank([&](int r, Engine& eng) {
      const int64_t h = eng.submit(entryOf(name, r == 0 ? cs.a : cs.b));
      CHECK(waitDone(eng, h));
      errors[r] = eng.state(h)->error();
    });
    for (int r = 0; r < 2; ++r) {
      const std::string& e = errors[r];
      CHECK_MSG(e.find("mismatched") != std::string::npos && e.find(cs.what) != std::string::npos,
                "case '%s', rank %d: %s", cs.what, r, e.c_str());
      CHECK_MSG(e.find(std::string("ranks [0] submitted ")) != std::string::npos &&
                    e.find(std::string("ranks [1] submitted ")) != std::string::npos,
                "case '%s', rank %d: %s", cs.what, r, e.c_str());
      CHECK_MSG(e.find(cs.a_says) != std::string::npos && e.find(cs.b_says) != std::string::npos,
                "case '%s', rank %d: %s", cs.what, r, e.c_str());
    }
  }
}

HVD_TEST_MAIN()
