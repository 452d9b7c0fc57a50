// p engines in one process, one per "rank", over in-process fabrics (one for
// negotiation, one for data), for end-to-end engine tests. Construction and
// shutdown run on every rank at once, as separate processes would.
// Calibration is off (the reducers' cost model keeps its defaults), the
// negotiation cycle is 200 us and the timeout 5 s unless the Config says
// otherwise. `data_links`, when given, replaces the data fabric's links
// (a test of transport failures hands out broken ones).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "transport/inproc_link.h"

namespace hvdtorch::test {

struct Cluster {
  static Config defaults() {
    Config cfg;
    cfg.cycle_time = std::chrono::microseconds(200);
    cfg.timeout = std::chrono::milliseconds(5000);
    cfg.calibrate = false;
    return cfg;
  }

  using LinkMaker = std::function<std::unique_ptr<Link>(int self, int peer)>;

  explicit Cluster(int p, Config cfg = defaults(), LinkMaker data_links = nullptr) : control(p), data(p) {
    engines.resize(p);
    std::vector<std::thread> ts;
    for (int r = 0; r < p; ++r) {
      ts.emplace_back([this, r, p, cfg, data_links] {
        Engine::Transports t;
        t.control = [this, r](int peer) { return control.link(r, peer); };
        t.data = [this, r, data_links](int peer) { return data_links ? data_links(r, peer) : data.link(r, peer); };
        engines[r] = std::make_unique<Engine>(cfg, Topology::build(r, std::vector<int>(p, 0)), t);
      });
    }
    for (auto& t : ts) t.join();
  }
  ~Cluster() {
    onEveryRank([](int, Engine& e) { e.shutdown(); });
  }
  // Runs fn(rank, engine) for every rank at once, one thread each, and waits.
  void onEveryRank(const std::function<void(int, Engine&)>& fn) {
    std::vector<std::thread> ts;
    for (int r = 0; r < static_cast<int>(engines.size()); ++r) ts.emplace_back([&, r] { fn(r, *engines[r]); });
    for (auto& t : ts) t.join();
  }

  InProcFabric control, data;
  std::vector<std::unique_ptr<Engine>> engines;
};

// Waits up to 10 s for the op behind `handle`; true when it finished.
inline bool waitDone(Engine& eng, int64_t handle) {
  return eng.state(handle)->waitFor(std::chrono::milliseconds(10000));
}

}  // namespace hvdtorch::test
