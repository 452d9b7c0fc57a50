// p engines in one process, one per in-process "rank", over in-process
// control and data fabrics: what the engine and op tests run against.
// `data_links`, when given, replaces the data fabric's links (a test of
// transport failures hands out broken ones; turn calibration off then, it
// runs over the data links). `native`, when given, is each rank's backend
// collectives (the engine does not own them; they must outlive the cluster).
// `control_wrap`, when given, wraps each control link (a test that delays
// or drops the control traffic of a rank).
#pragma once

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "ops/op_table.h"
#include "transport/inproc_link.h"

namespace hvdtorch::test {

struct Cluster {
  using LinkMaker = std::function<std::unique_ptr<Link>(int self, int peer)>;
  using NativeOf = std::function<NativeCollectives*(int rank)>;
  using LinkWrap = std::function<std::unique_ptr<Link>(int self, int peer, std::unique_ptr<Link> inner)>;

  explicit Cluster(int p, Config cfg = {}, LinkMaker data_links = nullptr, NativeOf native = nullptr,
                   LinkWrap control_wrap = nullptr)
      : control(p), data(p) {
    cfg.cycle_time = std::chrono::microseconds(200);
    cfg.timeout = std::chrono::milliseconds(5000);
    // Concurrently, as separate processes would: construction calibrates
    // the reducers, which is a collective.
    engines.resize(p);
    std::vector<std::thread> ts;
    for (int r = 0; r < p; ++r) {
      ts.emplace_back([this, r, p, cfg, data_links, native, control_wrap] {
        Engine::Transports t;
        if (native) t.native = native(r);
        t.control = [this, r, control_wrap](int peer) {
          return control_wrap ? control_wrap(r, peer, control.link(r, peer)) : control.link(r, peer);
        };
        t.data = [this, r, data_links](int peer) { return data_links ? data_links(r, peer) : data.link(r, peer); };
        engines[r] = std::make_unique<Engine>(cfg, Topology::build(r, std::vector<int>(p, 0)), t, ops::opTable());
      });
    }
    for (auto& t : ts) t.join();
  }
  ~Cluster() {
    // Shut down all ranks concurrently, as separate processes would.
    onEveryRank([](int, Engine& e) { e.shutdown(); });
  }
  // Runs fn(rank, engine) for every rank at once, one thread each, as the
  // ranks' own processes would, and waits for all of them.
  void onEveryRank(const std::function<void(int, Engine&)>& fn) {
    std::vector<std::thread> ts;
    for (int r = 0; r < static_cast<int>(engines.size()); ++r) ts.emplace_back([&, r] { fn(r, *engines[r]); });
    for (auto& t : ts) t.join();
  }
  InProcFabric control, data;
  std::vector<std::unique_ptr<Engine>> engines;
};

}  // namespace hvdtorch::test
