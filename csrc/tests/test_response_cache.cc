// The response cache's least-recently-used eviction: which entry goes, that
// its id is reused, and, with engines on in-process ranks, that an op pending
// by its cache bit on some ranks survives the eviction of its entry (it is
// negotiated in full again) and that ranks never disagree about ids, even
// when every cycle evicts.
#include <thread>

#include "check.h"
#include "cluster.h"
#include "engine/negotiation/response_cache.h"
#include "requests.h"

using namespace hvdtorch;
using hvdtorch::test::allreduceRequest;
using hvdtorch::test::Cluster;

namespace {

EntryPtr allreduceEntry(const std::string& name, int64_t n, float value) {
  auto e = std::make_shared<Entry>();
  e->request = allreduceRequest(name, n);
  auto t = std::make_shared<HostTensor>(DataType::kFloat32, std::vector<int64_t>{n});
  for (int64_t i = 0; i < n; ++i) static_cast<float*>(t->data())[i] = value + float(i);
  e->inputs = {t};
  e->outputs = {t};
  return e;
}

// Waits for the op and checks it is the sum over p ranks of value(r) + i.
void expectSum(Engine& eng, int64_t h, const EntryPtr& e, int p, float (*value)(int), const char* what) {
  CHECK_MSG(eng.state(h)->waitFor(std::chrono::milliseconds(15000)), "%s did not finish", what);
  CHECK_MSG(eng.state(h)->error().empty(), "%s: %s", what, eng.state(h)->error().c_str());
  float base = 0;
  for (int r = 0; r < p; ++r) base += value(r);
  const float* out = static_cast<const float*>(e->outputs[0]->data());
  for (int64_t i = 0; i < e->outputs[0]->numel(); ++i)
    CHECK_MSG(out[i] == base + float(p * i), "%s[%lld]: %g vs %g", what, (long long)i, out[i], base + float(p * i));
  eng.release(h);
}

float rankPlusOne(int r) { return float(r + 1); }

}  // namespace

TEST(full_cache_evicts_the_least_recently_used_entry_and_reuses_its_id) {
  ResponseCache cache(3);
  cache.put(allreduceRequest("a"));
  cache.put(allreduceRequest("b"));
  cache.put(allreduceRequest("c"));
  CHECK(cache.idOf("a") == 0 && cache.idOf("b") == 1 && cache.idOf("c") == 2);
  cache.touch(0);  // "a" ran from the cache: "b" is now the oldest
  cache.put(allreduceRequest("d"));
  CHECK(cache.idOf("b") == -1);
  CHECK(cache.idOf("d") == 1);
  CHECK(cache.at(1).name == "d");
  CHECK(cache.size() == 3);
  CHECK((cache.lruOrder() == std::vector<uint32_t>{2, 0, 1}));
  // A new signature under a cached name replaces it in place and counts as a use.
  cache.put(allreduceRequest("c", 8));
  CHECK(cache.idOf("c") == 2);
  CHECK(cache.lookup(allreduceRequest("c", 8)) == 2);
  CHECK(cache.lookup(allreduceRequest("c", 4)) == -1);
  CHECK((cache.lruOrder() == std::vector<uint32_t>{0, 1, 2}));
  cache.put(allreduceRequest("e"));  // evicts "a"
  CHECK(cache.idOf("a") == -1 && cache.idOf("e") == 0);
  CHECK_THROWS(cache.touch(7), InvalidArgument);
}

TEST(capacity_zero_caches_nothing) {
  ResponseCache cache(0);
  cache.put(allreduceRequest("a"));
  CHECK(cache.size() == 0 && cache.idOf("a") == -1 && cache.words() == 0);
}

TEST(same_updates_give_every_rank_the_same_cache) {
  // What the engine relies on: the state is a function of the sequence of
  // put/touch calls alone (no clock, no addresses, no hashing order).
  ResponseCache x(4), y(4);
  for (ResponseCache* c : {&x, &y}) {
    for (int i = 0; i < 40; ++i) {
      c->put(allreduceRequest("op" + std::to_string((i * 7) % 11)));
      if (i % 3 == 0) c->touch(static_cast<uint32_t>(i % c->size()));
    }
  }
  CHECK(x.lruOrder() == y.lruOrder());
  for (uint32_t id = 0; id < x.size(); ++id) CHECK(x.at(id).name == y.at(id).name);
}

TEST(op_pending_by_its_bit_survives_the_eviction_of_its_entry) {
  // Capacity 2. "a" and "b" are cached. Rank 0 submits "a" again (sent as
  // bit 0); before the others do, everyone runs "c", which evicts "a" (the
  // least recently used) and takes id 0. Rank 0 must now negotiate "a" in
  // full; were it to keep sending bit 0, that bit would mean "c".
  const int p = 3;
  Config cfg;
  cfg.cache_capacity = 2;
  Cluster c(p, cfg);
  c.onEveryRank([&](int r, Engine& eng) {
    for (const char* name : {"a", "b"}) {
      auto e = allreduceEntry(name, 4, rankPlusOne(r));
      expectSum(eng, eng.submit(e), e, p, rankPlusOne, name);
    }
  });
  c.onEveryRank([&](int r, Engine& eng) {
    EntryPtr a;
    int64_t ha = -1;
    if (r == 0) {
      a = allreduceEntry("a", 4, rankPlusOne(r));
      ha = eng.submit(a);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // several cycles: "a" goes out as a bit
    }
    auto cc = allreduceEntry("c", 4, rankPlusOne(r));
    expectSum(eng, eng.submit(cc), cc, p, rankPlusOne, "c");
    if (r != 0) {
      a = allreduceEntry("a", 4, rankPlusOne(r));
      ha = eng.submit(a);
    }
    expectSum(eng, ha, a, p, rankPlusOne, "a after its eviction");
  });
}

TEST(evicting_every_cycle_keeps_ranks_in_agreement) {
  // Six names through a cache of two, submitted in a different rotation on
  // every rank, for several rounds: entries are evicted while other ranks
  // hold them as bits. Any disagreement about ids would match the wrong ops
  // (wrong sums) or leave ops unmatched (errors after the deadline).
  const int p = 4;
  Config cfg;
  cfg.cache_capacity = 2;
  Cluster c(p, cfg);
  for (int round = 0; round < 6; ++round) {
    c.onEveryRank([&](int r, Engine& eng) {
      std::vector<EntryPtr> es;
      std::vector<int64_t> hs;
      for (int k = 0; k < 6; ++k) {
        const int j = (k + r * (round + 1)) % 6;
        es.push_back(allreduceEntry("t" + std::to_string(j), j + 1, rankPlusOne(r)));
        hs.push_back(eng.submit(es.back()));
        if ((k + r) % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      for (int k = 0; k < 6; ++k) expectSum(eng, hs[k], es[k], p, rankPlusOne, es[k]->request.name.c_str());
    });
  }
}

HVD_TEST_MAIN()
