// Runs a function as p in-process "ranks" (threads) over an InProcFabric, each
// with its own Context, and rethrows the first failure. Used by the algorithm
// tests. `local_links`, when given, makes the links between ranks of the same
// host (e.g. shared-memory links); the fabric stays the remote transport, so
// cross-host hops go over it as they would over c10d.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/context.h"
#include "transport/inproc_link.h"

namespace hvdtorch::test {

using LocalLinkMaker = std::function<std::unique_ptr<Link>(int self, int peer)>;

inline void runRanks(const std::vector<int>& host_of_rank, const std::function<void(Context&)>& body,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(20000),
                     const LocalLinkMaker& local_links = nullptr) {
  const int p = static_cast<int>(host_of_rank.size());
  InProcFabric fabric(p);
  std::vector<std::thread> threads;
  std::exception_ptr first;
  std::mutex mu;
  for (int r = 0; r < p; ++r) {
    threads.emplace_back([&, r] {
      try {
        Context::LinkFactory local;
        if (local_links) local = [&, r](int peer) { return local_links(r, peer); };
        Context ctx(Topology::build(r, host_of_rank), [&, r](int peer) { return fabric.link(r, peer); },
                    std::move(local), nullptr, timeout);
        body(ctx);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
        fabric.close();  // unblock the other ranks
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

inline void runRanks(int p, const std::function<void(Context&)>& body) {
  runRanks(std::vector<int>(p, 0), body);
}

}  // namespace hvdtorch::test
