#include "engine/control_plane.h"

#include <cstdint>

namespace hvdtorch {

void ControlPlane::sendBytes(Link& link, const std::vector<char>& bytes, Deadline d) {
  const uint64_t n = bytes.size();
  auto header = link.isend(&n, sizeof n);
  if (n > 0) link.send(bytes.data(), n, d);
  header->wait(d);
}

std::vector<char> ControlPlane::recvBytes(Link& link, Deadline d) {
  uint64_t n = 0;
  link.recv(&n, sizeof n, d);
  std::vector<char> bytes(n);
  if (n > 0) link.recv(bytes.data(), n, d);
  return bytes;
}

std::vector<char> ControlPlane::exchange(std::vector<char> mine, const Decide& decide) {
  const int p = ctx_.size();
  if (ctx_.rank() != 0) {
    Link& root = ctx_.link(0);
    sendBytes(root, mine, ctx_.deadline());
    return recvBytes(root, ctx_.deadline());
  }
  std::vector<std::vector<char>> all(p);
  all[0] = std::move(mine);
  for (int r = 1; r < p; ++r) all[r] = recvBytes(ctx_.link(r), ctx_.deadline());
  std::vector<char> reply = decide(all);
  for (int r = 1; r < p; ++r) sendBytes(ctx_.link(r), reply, ctx_.deadline());
  return reply;
}

}  // namespace hvdtorch
