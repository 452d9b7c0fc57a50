// The typed payloads of requests and responses. A request carries its op's
// OpArgs (what the caller asked for beyond the tensors), a response its op's
// OpPlan (what negotiation learned from every rank). The op table
// (engine/op_spec.h) says which alternative each op carries.
//
// Every payload type knows its own wire format and, for args, which of its
// fields belong to the signature, so the code around them visits the variant
// (std::visit) and never names an op. Contract of each type:
//   void write(ByteWriter&) const;  static T read(ByteReader&);
//     read() checks every enum and throws CollectiveError on a bad value.
// and of the args types also:
//   std::string mismatch(const T& other) const;
//     empty when two ranks' args may run together; otherwise what differs.
//     Fields that are per-rank (alltoall splits) are not compared.
//   void describe(std::ostream&) const;   ", Sum" after the tensors of describe()
//   std::optional<int32_t> rootRank() const;
//     the rank (of the set) the op cannot run without -- a broadcast's
//     source, a reduce's destination --, if it has one. The coordinator
//     checks it is in the set once every rank's signature agrees, and fails
//     the op while that rank has joined, whatever the op.
//   bool zerosAreNeutral() const;
//     whether zeros from a joined rank leave the result what the op
//     defines (a Sum or an Average, not a Min); asked only of ops whose row
//     says WhileJoined::kAddsZeros.
// The coordinator asks these through rootOf() and zerosAreNeutral() below,
// never by op. A new payload type is a struct here plus its alternative in
// OpArgs/OpPlan; nothing in engine/ names it.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "algorithms/reducer.h"
#include "common/dtype.h"
#include "engine/wire.h"

namespace hvdtorch {

// ---- request payloads ----------------------------------------------------

// Ops that need nothing beyond their tensors (allgather, barrier, join).
struct NoArgs {
  void write(ByteWriter&) const {}
  static NoArgs read(ByteReader&) { return {}; }
  std::string mismatch(const NoArgs&) const { return ""; }
  void describe(std::ostream&) const {}
  std::optional<int32_t> rootRank() const { return std::nullopt; }
  bool zerosAreNeutral() const { return true; }
};

// All-reduce and reduce-scatter. Average reaches the executor as such: it
// runs a Sum and divides by the number of ranks on the way out (exactly for
// integers), then applies the postscale. No reducer ever sees Average.
struct ReduceArgs {
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  ReducerId reducer = kAutoReducer;  // all-reduce only
  // All-reduce only. False: never pack this op with others in a fusion
  // buffer (the "no fusion" configurations of DistributedModel). Part of the
  // signature, so every rank plans the same units.
  bool fuse = true;

  void write(ByteWriter& w) const;
  static ReduceArgs read(ByteReader& r);
  std::string mismatch(const ReduceArgs& other) const;
  void describe(std::ostream& os) const;
  std::optional<int32_t> rootRank() const { return std::nullopt; }
  bool zerosAreNeutral() const { return op == ReduceOp::kSum || op == ReduceOp::kAverage; }
};

struct BroadcastArgs {
  int32_t root = 0;

  void write(ByteWriter& w) const { w.put(root); }
  static BroadcastArgs read(ByteReader& r) { return BroadcastArgs{r.get<int32_t>()}; }
  std::string mismatch(const BroadcastArgs& other) const;
  void describe(std::ostream& os) const { os << ", root " << root; }
  std::optional<int32_t> rootRank() const { return root; }
  bool zerosAreNeutral() const { return true; }
};

// Reduce (to one root): a reduction as ReduceArgs says, whose result only
// the root keeps.
struct ReduceToRootArgs {
  ReduceArgs reduce;
  int32_t root = 0;  // the root's rank in the set

  void write(ByteWriter& w) const {
    reduce.write(w);
    w.put(root);
  }
  static ReduceToRootArgs read(ByteReader& r) {
    ReduceToRootArgs a;
    a.reduce = ReduceArgs::read(r);
    a.root = r.get<int32_t>();
    return a;
  }
  std::string mismatch(const ReduceToRootArgs& other) const;
  void describe(std::ostream& os) const {
    reduce.describe(os);
    os << ", root " << root;
  }
  std::optional<int32_t> rootRank() const { return root; }
  bool zerosAreNeutral() const { return reduce.zerosAreNeutral(); }
};

// Rows of dimension 0 this rank sends to each rank, in rank order. Per rank:
// not part of the signature.
struct AlltoallArgs {
  std::vector<int64_t> splits;

  void write(ByteWriter& w) const { w.putVector(splits); }
  static AlltoallArgs read(ByteReader& r) { return AlltoallArgs{r.getVector<int64_t>()}; }
  std::string mismatch(const AlltoallArgs&) const { return ""; }
  void describe(std::ostream& os) const;
  std::optional<int32_t> rootRank() const { return std::nullopt; }
  bool zerosAreNeutral() const { return true; }
};

using OpArgs = std::variant<NoArgs, ReduceArgs, BroadcastArgs, AlltoallArgs, ReduceToRootArgs>;

// ---- response payloads ---------------------------------------------------

// Ops whose plan is their signature (and error responses, which carry no plan).
struct NoPlan {
  void write(ByteWriter&) const {}
  static NoPlan read(ByteReader&) { return {}; }
};

// First dimension of every tensor on every rank: first_dims[rank * tensors + t].
struct AllgatherPlan {
  std::vector<int64_t> first_dims;
  void write(ByteWriter& w) const { w.putVector(first_dims); }
  static AllgatherPlan read(ByteReader& r) { return AllgatherPlan{r.getVector<int64_t>()}; }
};

// Every rank's splits: splits[src * size + dst] rows go from src to dst.
struct AlltoallPlan {
  std::vector<int64_t> splits;
  void write(ByteWriter& w) const { w.putVector(splits); }
  static AlltoallPlan read(ByteReader& r) { return AlltoallPlan{r.getVector<int64_t>()}; }
};

// Rows of dimension 0 each rank keeps: rows[t * size + rank]. The first
// dim0 % size ranks get one row more than the others.
struct ReducescatterPlan {
  std::vector<int64_t> rows;
  void write(ByteWriter& w) const { w.putVector(rows); }
  static ReducescatterPlan read(ByteReader& r) { return ReducescatterPlan{r.getVector<int64_t>()}; }
};

// The rank (of the set) whose join() arrived last; what join() returns.
struct JoinPlan {
  int32_t last_rank = -1;
  void write(ByteWriter& w) const { w.put(last_rank); }
  static JoinPlan read(ByteReader& r) { return JoinPlan{r.get<int32_t>()}; }
};

using OpPlan = std::variant<NoPlan, AllgatherPlan, AlltoallPlan, ReducescatterPlan, JoinPlan>;

// ---- variant helpers -------------------------------------------------------

// Index of alternative T in variant V (a compile error if T is not one).
template <typename T, typename V>
struct AlternativeIndex;
template <typename T, typename... Ts>
struct AlternativeIndex<T, std::variant<Ts...>> {
  static constexpr size_t value = [] {
    constexpr bool is[] = {std::is_same_v<T, Ts>...};
    size_t i = 0;
    while (i < sizeof...(Ts) && !is[i]) ++i;
    return i;
  }();
  static_assert(value < sizeof...(Ts), "not an alternative of this variant");
};

template <typename V, size_t... I>
V readAlternativeOf(size_t index, ByteReader& r, std::index_sequence<I...>) {
  using Read = V (*)(ByteReader&);
  static constexpr Read reads[] = {[](ByteReader& rd) -> V { return std::variant_alternative_t<I, V>::read(rd); }...};
  return reads[index](r);
}

// Reads alternative `index` of V (a valid index: the op table gives it).
template <typename V>
V readAlternative(size_t index, ByteReader& r) {
  return readAlternativeOf<V>(index, r, std::make_index_sequence<std::variant_size_v<V>>{});
}

// What the engine asks of any request's args (the contract above), whichever op's.
inline std::optional<int32_t> rootOf(const OpArgs& args) {
  return std::visit([](const auto& a) { return a.rootRank(); }, args);
}
inline bool zerosAreNeutral(const OpArgs& args) {
  return std::visit([](const auto& a) { return a.zerosAreNeutral(); }, args);
}

}  // namespace hvdtorch
