// Everything an algorithm needs to talk to the other ranks: the topology, a
// Link per peer (chosen per hop: shared memory on the same host, the c10d
// link otherwise, as NCCL chooses per hop), the backend's native collectives
// and the deadline that bounds every wait.
#pragma once

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
  Context(Topology topo, LinkFactory remote_links, LinkFactory local_links,
          NativeCollectives* native, std::chrono::milliseconds timeout);

  const Topology& topo() const { return topo_; }
  int rank() const { return topo_.rank; }
  int size() const { return topo_.size; }
  NativeCollectives* native() const { return native_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  Deadline deadline() const { return Deadline::after(timeout_); }
  bool hasLocalTransport() const { return static_cast<bool>(local_links_); }

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

 private:
  Topology topo_;
  LinkFactory remote_factory_;
  LinkFactory local_links_;
  NativeCollectives* native_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Link>> remote_;
  std::vector<std::unique_ptr<Link>> local_;
};

}  // namespace hvdtorch
