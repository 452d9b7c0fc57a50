// Runs a function as p in-process "ranks" (threads) over an InProcFabric, each
// with its own Context. Used by the algorithm tests. `local_links`, when
// given, makes the links between ranks of the same host (e.g. shared-memory
// links); the fabric stays the remote transport, so cross-host hops go over
// it as they would over c10d.
//
// Every rank runs to its own end: a failing rank does not tear the fabric
// down under the others, so a test of failure detection sees what each
// surviving rank detected by itself (bounded by the links' deadlines).
// runRanksOutcomes() returns each rank's outcome; runRanks() prints every
// failing rank's error and rethrows the lowest failing rank's exception.
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "transport/context.h"
#include "transport/inproc_link.h"

namespace hvdtorch::test {

using LocalLinkMaker = std::function<std::unique_ptr<Link>(int self, int peer)>;
// Wraps the fabric's link from `self` to `peer` (to watch what goes over it).
using RemoteLinkWrap = std::function<std::unique_ptr<Link>(int self, int peer, std::unique_ptr<Link> link)>;

struct RankOutcome {
  std::exception_ptr error;  // null: the body returned normally
  std::string what;          // error's message, "" on success
  bool ok() const { return !error; }
};

inline std::vector<RankOutcome> runRanksOutcomes(const std::vector<int>& host_of_rank,
                                                 const std::function<void(Context&)>& body,
                                                 std::chrono::milliseconds timeout = std::chrono::milliseconds(20000),
                                                 const LocalLinkMaker& local_links = nullptr,
                                                 const RemoteLinkWrap& wrap_remote = nullptr) {
  const int p = static_cast<int>(host_of_rank.size());
  InProcFabric fabric(p);
  std::vector<RankOutcome> out(p);
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r) {
    threads.emplace_back([&, r] {
      try {
        Context::LinkFactory local;
        if (local_links) local = [&, r](int peer) { return local_links(r, peer); };
        Context::LinkFactory remote = [&, r](int peer) { return fabric.link(r, peer); };
        if (wrap_remote) remote = [&, r](int peer) { return wrap_remote(r, peer, fabric.link(r, peer)); };
        Context ctx(Topology::build(r, host_of_rank), std::move(remote), std::move(local), nullptr, timeout);
        body(ctx);
      } catch (const std::exception& e) {
        out[r].error = std::current_exception();
        out[r].what = e.what();
      } catch (...) {
        out[r].error = std::current_exception();
        out[r].what = "(not a std::exception)";
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

inline void runRanks(const std::vector<int>& host_of_rank, const std::function<void(Context&)>& body,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(20000),
                     const LocalLinkMaker& local_links = nullptr, const RemoteLinkWrap& wrap_remote = nullptr) {
  const auto outcomes = runRanksOutcomes(host_of_rank, body, timeout, local_links, wrap_remote);
  std::exception_ptr first;
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (outcomes[r].ok()) continue;
    std::fprintf(stderr, "  rank %zu failed: %s\n", r, outcomes[r].what.c_str());
    if (!first) first = outcomes[r].error;
  }
  if (first) std::rethrow_exception(first);
}

inline void runRanks(int p, const std::function<void(Context&)>& body) { runRanks(std::vector<int>(p, 0), body); }

}  // namespace hvdtorch::test
