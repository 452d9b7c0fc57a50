// Requests (what one rank asks the engine to do) and responses (what every
// rank is told to do, identically, by the coordinator).
//
// A request's *signature* is everything that must agree across ranks for the
// operation to be well-defined: op type, dtypes, shapes (for allgather, all
// but the first dimension), reduce op, root, scale factors, reducer. The
// coordinator compares signatures and turns any disagreement into an error
// response that names the op and the ranks, on every rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/reducer.h"
#include "common/dtype.h"
#include "engine/wire.h"

namespace hvdtorch {

enum class OpType : uint8_t { kAllreduce = 0, kAllgather, kBroadcast, kBarrier };
const char* opTypeName(OpType t);

struct TensorSpec {
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  int64_t numel() const;
};

struct Request {
  OpType type = OpType::kAllreduce;
  std::string name;
  std::vector<TensorSpec> tensors;  // more than one for grouped_allreduce
  // Average reaches the executor as such: it runs a Sum and divides by the
  // number of ranks on the way out (exactly for integers), then postscale.
  ReduceOp op = ReduceOp::kSum;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  ReducerKind reducer = ReducerKind::kAuto;
  // False: never pack this op with others in a fusion buffer (the "no
  // fusion" configurations of DistributedModel). Part of the signature, so
  // every rank plans the same units.
  bool fuse = true;

  void write(ByteWriter& w) const;
  static Request read(ByteReader& r);
  // Empty if `a` and `b` may run together; otherwise says what differs
  // ("shape [2, 3] vs [3, 2]").
  static std::string signatureMismatch(const Request& a, const Request& b);
  std::string describe() const;  // "allreduce 'grad.w' (float32 [4, 5], Sum)"
};

struct Response {
  OpType type = OpType::kAllreduce;
  std::vector<std::string> names;  // > 1 only for a grouped request (one name)
  std::string error;                // non-empty: fail these ops on every rank
  // Allgather: first dimension of every tensor on every rank,
  // first_dims[rank * tensors + t].
  std::vector<int64_t> first_dims;

  void write(ByteWriter& w) const;
  static Response read(ByteReader& r);
};

struct ResponseList {
  std::vector<Response> responses;
  std::vector<uint32_t> cached_ready;  // cache ids every rank has ready
  bool shutdown = false;
  int32_t shutdown_rank = -1;
  std::string shutdown_reason;  // the error that made a rank stop, if any

  std::vector<char> serialize() const;
  static ResponseList parse(const std::vector<char>& bytes);
};

// What one rank tells the coordinator each cycle.
struct RankMessage {
  bool shutdown = false;
  std::string failure;  // why this rank stops, when it stops on an error
  std::vector<uint64_t> cache_bits;    // bit i: cached request i is pending here
  std::vector<Request> uncached;      // new requests not in the cache

  std::vector<char> serialize() const;
  static RankMessage parse(const std::vector<char>& bytes);
};

}  // namespace hvdtorch
