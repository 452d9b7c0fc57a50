#include "transport/context.h"

#include <algorithm>

#include "common/error.h"

namespace hvdtorch {

namespace {

// A Link owned elsewhere (by the parent context), used through a view.
class LinkRef : public Link {
 public:
  explicit LinkRef(Link& link) : link_(link) {}
  int peer() const override { return link_.peer(); }
  const char* kind() const override { return link_.kind(); }
  std::unique_ptr<LinkRequest> isend(const void* data, size_t bytes) override { return link_.isend(data, bytes); }
  std::unique_ptr<LinkRequest> irecv(void* data, size_t bytes) override { return link_.irecv(data, bytes); }

 private:
  Link& link_;
};

}  // namespace

std::unique_ptr<Context> Context::view(Context& parent, const std::vector<int>& members, NativeCollectives* native) {
  const Topology& pt = parent.topo();
  const auto me = std::find(members.begin(), members.end(), pt.rank);
  if (me == members.end())
    throw InvalidArgument(strCat("rank ", pt.rank, " is not a member of the process set it is asked to view"));
  // Dense host indices, in order of first appearance among the members.
  std::vector<int> host_of_member;
  std::vector<int> dense(pt.num_hosts, -1);
  int hosts = 0;
  for (int g : members) {
    if (g < 0 || g >= pt.size) throw InvalidArgument(strCat("process set member ", g, " is not a rank"));
    int& h = dense[pt.host_of_rank[g]];
    if (h < 0) h = hosts++;
    host_of_member.push_back(h);
  }
  Topology t = Topology::build(static_cast<int>(me - members.begin()), host_of_member);
  LinkFactory through_parent = [&parent, members](int peer) {
    return std::make_unique<LinkRef>(parent.link(members[peer]));
  };
  return std::make_unique<Context>(std::move(t), std::move(through_parent), nullptr, native, parent.timeout());
}

Context::Context(Topology topo, LinkFactory remote_links, LinkFactory local_links, NativeCollectives* native,
                 std::chrono::milliseconds timeout)
    : topo_(std::move(topo)),
      remote_factory_(std::move(remote_links)),
      local_links_(std::move(local_links)),
      native_(native),
      timeout_(timeout),
      remote_(topo_.size),
      local_(topo_.size) {}

void Context::close() {
  std::vector<std::unique_ptr<Link>> remote, local;
  LinkFactory remote_factory, local_factory;
  {
    std::lock_guard<std::mutex> lock(mu_);
    remote.swap(remote_);
    local.swap(local_);
    remote_factory.swap(remote_factory_);
    local_factory.swap(local_links_);
    remote_.resize(topo_.size);
    local_.resize(topo_.size);
    closed_ = true;
    native_ = nullptr;
  }
  // Destroyed outside the lock: a link's destructor may wait for its peer.
}

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
  if (closed_) throw CollectiveError(strCat("rank ", topo_.rank, ": links are closed (hvdtorch was shut down)"));
  if (!remote_[peer]) remote_[peer] = remote_factory_(peer);
  return *remote_[peer];
}

}  // namespace hvdtorch
