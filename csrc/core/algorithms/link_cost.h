// What the links between hosts cost, and what each reducer puts on them: the
// part of reducer `auto`'s cost model (cost_model.h) that sees the network.
//
// On one host every reducer's traffic stays in shared memory or loopback,
// and the registry's priors (reducer_registry.h) describe it. Across hosts
// the host's network link is the narrow part: how many bytes a reducer sends
// through the busiest host's link, and how many link crossings it waits for
// one after the other, decide its time once messages are large. So:
//  * measureLink() times the link once, at calibration: the host leaders
//    (local rank 0 of every host) all-reduce a small and a large buffer
//    among themselves with the ring, and fit a latency per crossing and a
//    time per byte to it; every rank then takes the same values.
//  * Each reducer states its traffic for a topology (Reducer::linkTraffic):
//    messages and bytes on the busiest host's link as lines in the message
//    size. The prior of a reducer then adds linkSeconds() to its registry
//    line, so the first choice of every size band, and the estimate of every
//    band not measured yet, count the bytes on the wire.
#pragma once

#include <cstddef>
#include <vector>

namespace hvdtorch {

class Context;
struct Topology;

// One host's link, as seen by a ring among the host leaders.
struct LinkCost {
  double latency = 0;           // seconds per crossing of a link (one message, one way)
  double seconds_per_byte = 0;  // per byte through one host's link, one direction
  bool known() const { return seconds_per_byte > 0; }
};

// What one all-reduce of n bytes puts on the busiest host's link: messages
// waited for one after the other (crossings, each paying the latency) and
// bytes sent through that link in one direction, both lines in n.
struct LinkTraffic {
  double messages = 0;
  double messages_per_byte = 0;  // chunked reducers cross once more per chunk
  double bytes_per_byte = 0;
};

// Seconds of `traffic` for an n-byte all-reduce over links of `link`.
double linkSeconds(const LinkCost& link, const LinkTraffic& traffic, size_t bytes);

// The traffic of a ring all-reduce over `members` (ranks of `topo`, ring
// order): 2(p-1) steps, each moving one p-th of the buffer over every edge
// of the ring, so 2(p-1)/p of it per edge; a host's link carries every edge
// that leaves the host, and every step waits for a crossing when any does.
LinkTraffic ringTraffic(const Topology& topo, const std::vector<int>& members);

// Collective, every rank of ctx: times the link between hosts (see above) and
// returns the same LinkCost on every rank; unknown with one host. Costs
// kLinkReps all-reduces of kLinkSmallBytes and of kLinkLargeBytes among the
// leaders (about 0.1 s at 100 Mbit/s per large one).
constexpr size_t kLinkSmallBytes = size_t(4) << 10;
constexpr size_t kLinkLargeBytes = size_t(1) << 20;
constexpr int kLinkReps = 3;
LinkCost measureLink(Context& ctx);

}  // namespace hvdtorch
