// The coordinator's decision logic: given every rank's message for one
// cycle, decide which operations are ready everywhere, in which order, and
// which are errors. Each process set has one, on its rank 0 (global rank 0
// for the global set); it sees the cycles that go through the star exchange
// (Controller::starExchange), not those the AND of cache bits settles alone
// (ranFromCache tells it about those). Pure logic with no I/O, so it is unit
// tested directly.
//
// Rules:
//  * An op is ready when every rank has submitted it, either in full
//    (uncached) or as its cache bit. Ready ops are ordered by first arrival;
//    ops ready purely from cache bits come first, in cache-id order.
//  * Signatures that differ across ranks give an error response naming the
//    op, what differs and which ranks hold which variant.
//  * An op that some ranks submitted and others did not for `stall_warning`
//    produces one warning naming the missing ranks; after `timeout` it is
//    failed on every rank with the same names, so nobody hangs.
//  * Any rank asking to shut down stops everyone, and the response says who.
//  * Join (Horovod's hvd.join(), for uneven data): a rank with a join
//    pending counts as having submitted every other op; the response names
//    it in `joined` and carries a stand-in request, which the joined rank
//    runs on zeros so that the others' collectives find every peer. So a
//    joined rank adds zeros to all-reduces (Sum and Average only: Average
//    still divides by every rank, as Horovod does), no rows to allgathers,
//    and receives broadcasts; reduce-scatter, alltoall, the other reduce ops
//    and any op whose root has joined are errors (each op's rule is the
//    while_joined column of the op table, engine/op_spec.h; its reduce op
//    and root are its payload's answers, engine/op_payloads.h, so nothing
//    here names an op). The join itself is ready
//    once every rank has joined, never times out (the others may train for
//    a long time yet) and tells everyone the rank that joined last.
//  * Ops named with kNoStandInPrefix are never stood in for: a joined rank
//    submits them itself and takes part with its own data (a sharded
//    optimizer's rank keeps stepping its shard after hvd.join(), since no
//    other rank holds that shard's state). Until it does, they wait, and
//    time out like any op.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/negotiation/response_cache.h"
#include "engine/request.h"

namespace hvdtorch {

// Names of ops that joined ranks submit themselves (see the rules above).
inline constexpr std::string_view kNoStandInPrefix = "hvdtorch.no_stand_in.";

class Coordinator {
 public:
  using Clock = std::chrono::steady_clock;
  using WarnFn = std::function<void(const std::string&)>;

  Coordinator(int size, std::chrono::milliseconds stall_warning, std::chrono::milliseconds timeout, WarnFn warn);

  ResponseList process(const std::vector<RankMessage>& msgs, const ResponseCache& cache, Clock::time_point now);

  // Ops that ran from the cache in a cycle that did not go through the
  // coordinator (the decentralized steady state): their stall timers, if
  // any, belonged to that run and must not carry over to the next one.
  void ranFromCache(const std::vector<uint32_t>& ids);

  // For a process set: messages name its members by their global ranks
  // (global_ranks[i] for set rank i) and say which set ("process set 1
  // [0, 2]"). The global set keeps the defaults (identity, no scope).
  void setScope(std::vector<int> global_ranks, std::string scope);

 private:
  struct Pending {
    std::vector<std::optional<Request>> by_rank;
    Clock::time_point first_seen;
    uint64_t arrival;
    bool warned = false;
    bool join = false;  // a join (no other op shares its name on any rank)
  };
  struct BitState {
    Clock::time_point first_seen;
    bool warned = false;
    std::string name;  // the op behind the id (an evicted id is reused)
  };

  using BitRanks = std::map<uint32_t, std::vector<bool>>;

  // The steps of process(), in order:
  // Records shutdown requests in `out` and every uncached request in table_.
  void takeMessages(const std::vector<RankMessage>& msgs, Clock::time_point now, ResponseList& out);
  // Which ranks have each cache bit set this cycle (ids some rank has set).
  BitRanks bitRanks(const std::vector<RankMessage>& msgs, const ResponseCache& cache) const;
  // Responses for table_ ops every rank has submitted (in full, by cache bit,
  // or by having joined), in arrival order; the join's, if ready, apart.
  // Removes them from table_ and their bits from `bit_ranks`.
  void readyFromTable(const ResponseCache& cache, BitRanks& bit_ranks, const std::vector<bool>& joined,
                      std::vector<Response>& ready, std::optional<Response>& join_done);
  // Ops ready purely from cache bits: cached_ready ids, or a full response
  // when joined ranks stand in. Removes them from `bit_ranks`.
  void readyFromBits(const ResponseCache& cache, BitRanks& bit_ranks, const std::vector<bool>& joined,
                     ResponseList& out);
  // Stall warnings and timeouts for what is still incomplete: table_ ops
  // (whose bits are then dropped from `bit_ranks`), then bare bits.
  void checkTableStalls(const ResponseCache& cache, BitRanks& bit_ranks, const std::vector<bool>& joined,
                        Clock::time_point now, std::vector<Response>& failed);
  void checkBitStalls(const ResponseCache& cache, const BitRanks& bit_ranks, Clock::time_point now,
                      std::vector<Response>& failed);

  // "[0, 2]": the given set ranks, printed as global ranks.
  std::string rankList(const std::vector<int>& ranks) const;
  // Per rank: has it submitted `name`, in full or by its cache bit?
  // Joined ranks count as having submitted every op but the join and the
  // ops named with kNoStandInPrefix.
  std::vector<bool> submitted(const std::string& name, const Pending& pending, const ResponseCache& cache,
                              const BitRanks& bit_ranks, const std::vector<bool>& joined) const;

  // makeResponse and its steps, each returning an error ("" when fine):
  // `stand_ins`: the ranks that run this op as joined ranks (their entries
  // in `reqs` are copies of another rank's request).
  Response makeResponse(std::vector<Request> reqs, const std::vector<int>& stand_ins) const;
  // The op's rule while ranks have joined; gives stand-ins of ops that add
  // no rows an empty first dimension.
  std::string whileJoinedError(std::vector<Request>& reqs, const std::vector<int>& stand_ins) const;
  // "allreduce with Sum or Average, allgather, broadcast and barrier", from the op table.
  static std::string opsRunningWhileJoined();
  // Signatures that differ across ranks, every variant with its ranks.
  std::string validate(const std::vector<Request>& reqs) const;
  // Args that make no sense in this set: a root (OpArgs' rootRank(), any op's) outside it.
  std::string argsError(const Request& model) const;
  // The op's plan from every rank's request, into `s`.
  std::string planInto(const std::vector<Request>& reqs, Response& s) const;

  // Whether a joined rank stands in for the op called `name` (it submits
  // those with kNoStandInPrefix itself).
  static bool standsIn(const std::string& name);
  // Per rank: has it a join pending (from table_)?
  std::vector<bool> joinedRanks() const;
  // Checks an incomplete op; returns an error response once it has timed out.
  std::optional<Response> checkStall(const std::string& what, OpType type, const std::string& name,
                                     const std::vector<bool>& has, Clock::time_point first_seen, bool& warned,
                                     Clock::time_point now);

  int size_;
  std::chrono::milliseconds stall_warning_;
  std::chrono::milliseconds timeout_;
  WarnFn warn_;
  std::vector<int> names_;  // global rank of each set rank; empty: the same
  std::string scope_;       // "" for the global set
  uint64_t next_arrival_ = 0;
  std::map<std::string, Pending> table_;
  std::map<uint32_t, BitState> bits_;
  int last_joined_ = -1;  // the rank whose join arrived last (this round of joins)
};

}  // namespace hvdtorch
