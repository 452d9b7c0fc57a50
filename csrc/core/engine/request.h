// Requests (what one rank asks the engine to do) and responses (what every
// rank is told to do, identically on every rank). A response comes either
// from the coordinator (Coordinator::process, for ops negotiated in full) or,
// for an op every rank has in its response cache, is rebuilt by each rank
// from the cached request once the AND of the ranks' cache bits says it is
// ready (Controller::takeReady).
//
// Each carries a typed payload (engine/op_payloads.h): a request's OpArgs
// (the reduce op and scales of all-reduce and reduce-scatter, a broadcast's
// root, an alltoall's splits) and a response's OpPlan (what negotiation
// learned from every rank: allgather first dimensions, every rank's alltoall
// splits, the reduce-scatter split). The alternative held always matches the
// op type: its row of the op table (engine/op_spec.h) says which.
//
// A request's *signature* is everything that must agree across ranks for the
// operation to be well-defined: op type, process set, dtypes, device kinds,
// shapes (for
// allgather and alltoall, all but the first dimension), and the args that
// are not per-rank (reduce op, scale factors, reducer, root; alltoall splits
// are per-rank). The coordinator compares signatures and turns any
// disagreement into an error response that names the op and the ranks, on
// every rank.
//
// Wire format: versionless (every rank runs the same binary); the readers
// check every enum and length and throw CollectiveError on a malformed frame.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "device/device.h"
#include "engine/op_payloads.h"
#include "engine/op_spec.h"
#include "engine/wire.h"

namespace hvdtorch {

struct TensorSpec {
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  // The kind only: ranks may hold their tensors on different GPUs (each its
  // own), but not some on a GPU and others on the host.
  DeviceKind device = DeviceKind::kCpu;
  int64_t numel() const;
};

// ---- messages --------------------------------------------------------------

struct Request {
  OpType type = OpType::kAllreduce;
  std::string name;
  int32_t process_set_id = 0;       // 0: the global set (every rank); others: Engine::addProcessSet
  std::vector<TensorSpec> tensors;  // more than one for grouped ops
  OpArgs args;

  // The payload as its op's own type, for the op's code (ops/<op>.cc) and
  // fusion (ReduceArgs): req.payload<BroadcastArgs>().root.
  // std::bad_variant_access on a mismatch: a bug.
  template <typename Args>
  const Args& payload() const {
    return std::get<Args>(args);
  }

  void write(ByteWriter& w) const;
  static Request read(ByteReader& r);
  // Empty if `a` and `b` may run together; otherwise says what differs
  // ("shape [2, 3] vs [3, 2]").
  static std::string signatureMismatch(const Request& a, const Request& b);
  std::string describe() const;  // "allreduce 'grad.w' (float32 [4, 5], Sum)"
};

// What negotiation tells every rank about an op every rank submitted with
// matching signatures (by_rank[r]: rank r's request): its row's make_plan,
// NoPlan for ops without one. Throws InvalidArgument when the requests cannot
// run (alltoall splits that do not fit), which the coordinator turns into an
// error response.
OpPlan makePlan(const std::vector<const Request*>& by_rank);

struct Response {
  OpType type = OpType::kAllreduce;
  std::string name;
  int32_t process_set_id = 0;
  std::string error;  // non-empty: fail this op on every rank
  OpPlan plan;
  // Ranks (of the set) that have joined and never submitted this op: each
  // runs `stand_in` instead, a copy of the others' request whose tensors are
  // zeros (allgather: with no rows), and drops its outputs. Empty while no
  // rank has joined.
  std::vector<int32_t> joined;
  std::optional<Request> stand_in;

  void write(ByteWriter& w) const;
  static Response read(ByteReader& r);
};

struct ResponseList {
  std::vector<Response> responses;
  std::vector<uint32_t> cached_ready;  // cache ids every rank has ready
  bool shutdown = false;
  int32_t shutdown_rank = -1;
  std::string shutdown_reason;  // the error that made a rank stop, if any
  // Global set only: the process sets (ids > 0, ascending) some rank has
  // work in; their members run those sets' exchanges next, in this order.
  std::vector<int32_t> busy_sets;

  std::vector<char> serialize() const;
  static ResponseList parse(const std::vector<char>& bytes);
};

// What one rank tells the coordinator each cycle.
struct RankMessage {
  bool shutdown = false;
  std::string failure;               // why this rank stops, when it stops on an error
  std::vector<uint64_t> cache_bits;  // bit i: cached request i is pending here
  std::vector<Request> uncached;     // new requests not in the cache
  std::vector<int32_t> busy_sets;    // global set only: sets (id > 0) with work on this rank

  std::vector<char> serialize() const;
  static RankMessage parse(const std::vector<char>& bytes);
};

}  // namespace hvdtorch
