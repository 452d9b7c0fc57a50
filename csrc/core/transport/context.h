// Everything an algorithm needs to talk to the other ranks: the topology, a
// Link per peer (chosen per hop: shared memory on the same host, the c10d
// link otherwise, as NCCL chooses per hop), the backend's native collectives
// and the deadline that bounds every wait (one per operation).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "transport/link.h"
#include "transport/native_collectives.h"
#include "transport/topology.h"

namespace hvdtorch {

class Context {
 public:
  using LinkFactory = std::function<std::unique_ptr<Link>(int peer)>;

  // `local_links` may be empty: then every hop goes through `remote_links`.
  Context(Topology topo, LinkFactory remote_links, LinkFactory local_links, NativeCollectives* native,
          std::chrono::milliseconds timeout);

  // A process set's view of `parent`: rank i of the view is global rank
  // members[i] (ascending, this rank among them). Its links are the parent's
  // own link objects (shared memory or c10d, as the parent chose per hop),
  // reached through non-owning references, so a set opens no transport of
  // its own. The parent must outlive the view, and traffic on the shared
  // links must stay in one order on both ends of every link (the engine
  // runs every set's ops on one thread, in one order, on every rank).
  // `native`: the backend's collectives over exactly these members (groups
  // of their own), or null; the parent's span every rank and do not serve.
  static std::unique_ptr<Context> view(Context& parent, const std::vector<int>& members,
                                       NativeCollectives* native = nullptr);

  const Topology& topo() const { return topo_; }
  int rank() const { return topo_.rank; }
  int size() const { return topo_.size; }
  NativeCollectives* native() const { return native_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // How much longer than a peer a rank waits for what that peer relays (its
  // result, or its last word naming the rank that stalled it): peerGrace
  // (common/deadline.h). Waiting exactly as long as the relaying peer could
  // only end in blaming it.
  std::chrono::milliseconds relayGrace() const { return peerGrace(timeout_); }
  // The running operation's deadline (OperationDeadline, common/deadline.h)
  // where one is set on this thread, else the timeout from now.
  Deadline deadline() const {
    const Deadline* op = OperationDeadline::current();
    return op ? *op : Deadline::after(timeout_);
  }

  // The link to `peer`, created on first use. Both ends must ask for their
  // link in a compatible order (any algorithm that talks to a peer does).
  Link& link(int peer);
  // Force a specific transport for this hop (used by tests and ablations).
  Link& remoteLink(int peer);
  // The link link(peer) would return if it already exists, else nullptr
  // (never creates one).
  Link* openLink(int peer);
  // Transport kinds of the links created so far to `peer` ("shm", "c10d",
  // ...), for tests and diagnostics.
  std::vector<std::string> linkKinds(int peer);
  // Destroys every link and the factories (which may hold process groups and
  // their threads and sockets alive) and forgets the native collectives.
  // For shutdown, once nobody uses the links any more; a later link() throws.
  void close();

 private:
  Topology topo_;
  LinkFactory remote_factory_;
  LinkFactory local_links_;
  NativeCollectives* native_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  bool closed_ = false;
  std::vector<std::unique_ptr<Link>> remote_;
  std::vector<std::unique_ptr<Link>> local_;
};

}  // namespace hvdtorch
