#include "transport/context.h"

#include "common/error.h"

namespace hvdtorch {

Context::Context(Topology topo, LinkFactory remote_links, LinkFactory local_links,
                 NativeCollectives* native, std::chrono::milliseconds timeout)
    : topo_(std::move(topo)),
      remote_factory_(std::move(remote_links)),
      local_links_(std::move(local_links)),
      native_(native),
      timeout_(timeout),
      remote_(topo_.size),
      local_(topo_.size) {}

Link& Context::link(int peer) {
  if (local_links_ && topo_.sameHost(peer)) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!local_[peer]) local_[peer] = local_links_(peer);
    return *local_[peer];
  }
  return remoteLink(peer);
}

Link* Context::openLink(int peer) {
  if (peer < 0 || peer >= topo_.size || peer == topo_.rank) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  if (local_links_ && topo_.sameHost(peer)) return local_[peer].get();
  return remote_[peer].get();
}

std::vector<std::string> Context::linkKinds(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> kinds;
  if (peer < 0 || peer >= topo_.size) return kinds;
  if (local_[peer]) kinds.push_back(local_[peer]->kind());
  if (remote_[peer]) kinds.push_back(remote_[peer]->kind());
  return kinds;
}

Link& Context::remoteLink(int peer) {
  if (peer < 0 || peer >= topo_.size || peer == topo_.rank)
    throw InvalidArgument(strCat("rank ", topo_.rank, ": no link to peer ", peer));
  std::lock_guard<std::mutex> lock(mu_);
  if (!remote_[peer]) remote_[peer] = remote_factory_(peer);
  return *remote_[peer];
}

}  // namespace hvdtorch
