#include "engine/negotiation/coordinator.h"

#include <algorithm>
#include <sstream>

namespace hvdtorch {

namespace {

bool bitSet(const std::vector<uint64_t>& bits, uint32_t id) {
  const size_t w = id / 64;
  return w < bits.size() && ((bits[w] >> (id % 64)) & 1u);
}

double seconds(std::chrono::milliseconds d) { return static_cast<double>(d.count()) / 1000.0; }

}  // namespace

Coordinator::Coordinator(int size, std::chrono::milliseconds stall_warning, std::chrono::milliseconds timeout,
                         WarnFn warn)
    : size_(size), stall_warning_(stall_warning), timeout_(timeout), warn_(std::move(warn)) {}

void Coordinator::setScope(std::vector<int> global_ranks, std::string scope) {
  names_ = std::move(global_ranks);
  scope_ = std::move(scope);
}

std::string Coordinator::rankList(const std::vector<int>& ranks) const {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << (names_.empty() ? ranks[i] : names_[ranks[i]]);
  os << "]";
  return os.str();
}

std::string Coordinator::validate(const std::vector<Request>& reqs) const {
  // Group ranks by signature; report every variant with the ranks holding it.
  std::vector<int> variant_of(size_, -1);
  std::vector<int> leaders;
  for (int r = 0; r < size_; ++r) {
    for (size_t v = 0; v < leaders.size(); ++v) {
      if (Request::signatureMismatch(reqs[leaders[v]], reqs[r]).empty()) {
        variant_of[r] = static_cast<int>(v);
        break;
      }
    }
    if (variant_of[r] < 0) {
      variant_of[r] = static_cast<int>(leaders.size());
      leaders.push_back(r);
    }
  }
  if (leaders.size() == 1) return "";
  std::ostringstream os;
  os << "mismatched " << opTypeName(reqs[0].type) << " '" << reqs[0].name << "' across ranks"
     << (scope_.empty() ? "" : " of " + scope_) << ": "
     << Request::signatureMismatch(reqs[leaders[0]], reqs[leaders[1]]) << ". ";
  for (size_t v = 0; v < leaders.size(); ++v) {
    std::vector<int> ranks;
    for (int r = 0; r < size_; ++r)
      if (variant_of[r] == static_cast<int>(v)) ranks.push_back(r);
    os << (v ? "; " : "") << "ranks " << rankList(ranks) << " submitted " << reqs[leaders[v]].describe();
  }
  return os.str();
}

std::string Coordinator::whileJoinedError(std::vector<Request>& reqs, const std::vector<int>& stand_ins) const {
  const Request& model = reqs[0];
  const std::string joined = strCat("ranks ", rankList(stand_ins), " have joined");
  // The row says what the op does with joined ranks; the payload answers
  // for the request (its reduce op, its root), whichever op it is.
  const WhileJoined rule = opSpec(model.type).while_joined;
  const bool adds_zeros_wrongly = rule == WhileJoined::kAddsZeros && !zerosAreNeutral(model.args);
  if (rule == WhileJoined::kRefused || adds_zeros_wrongly)
    return strCat(model.describe(), (scope_.empty() ? "" : " in " + scope_), ": cannot run while ", joined,
                  " (while ranks have joined, only ", opsRunningWhileJoined(),
                  " run; joined ranks take part with zeros)");
  const std::optional<int32_t> root = rootOf(model.args);
  if (root && std::find(stand_ins.begin(), stand_ins.end(), *root) != stand_ins.end())
    return strCat(model.describe(), ": its root rank ", rankList({*root}),
                  " has joined (a joined rank neither sends data nor keeps a result)");
  if (rule == WhileJoined::kAddsNoRows) {
    for (int r : stand_ins) {
      for (auto& t : reqs[r].tensors) {
        if (t.shape.empty()) return strCat(model.describe(), ": cannot gather a scalar while ", joined);
        t.shape[0] = 0;  // a joined rank contributes no rows
      }
    }
  }
  return "";
}

std::string Coordinator::opsRunningWhileJoined() {
  std::vector<std::string> names;
  for (const OpSpec& spec : opTable()) {
    switch (spec.while_joined) {
      case WhileJoined::kAddsZeros: names.push_back(strCat(spec.name, " with Sum or Average")); break;
      case WhileJoined::kAddsNoRows:
      case WhileJoined::kReceives:
      case WhileJoined::kTakesPart: names.push_back(spec.name); break;
      case WhileJoined::kRefused:
      case WhileJoined::kIsJoin: break;
    }
  }
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return out;
}

std::string Coordinator::argsError(const Request& model) const {
  const std::optional<int32_t> root = rootOf(model.args);
  if (root && (*root < 0 || *root >= size_))
    return strCat(opTypeName(model.type), " '", model.name, "': root rank ", *root, " is not in [0, ", size_, ")");
  return "";
}

std::string Coordinator::planInto(const std::vector<Request>& reqs, Response& s) const {
  std::vector<const Request*> by_rank(size_);
  for (int r = 0; r < size_; ++r) by_rank[r] = &reqs[r];
  try {
    s.plan = makePlan(by_rank);
  } catch (const InvalidArgument& e) {
    return strCat(opTypeName(s.type), " '", s.name, "': ", e.what());
  }
  return "";
}

Response Coordinator::makeResponse(std::vector<Request> reqs, const std::vector<int>& stand_ins) const {
  Response s;
  s.type = reqs[0].type;
  s.name = reqs[0].name;
  s.process_set_id = reqs[0].process_set_id;
  if (opSpec(s.type).while_joined == WhileJoined::kIsJoin) {
    s.plan = JoinPlan{last_joined_};
    return s;
  }
  // Each step runs only if the ones before found nothing wrong.
  if (!stand_ins.empty()) s.error = whileJoinedError(reqs, stand_ins);
  if (s.error.empty()) s.error = validate(reqs);
  if (s.error.empty()) s.error = argsError(reqs[0]);
  if (s.error.empty()) s.error = planInto(reqs, s);
  if (!s.error.empty()) return s;
  if (!stand_ins.empty()) {
    s.joined.assign(stand_ins.begin(), stand_ins.end());
    s.stand_in = reqs[stand_ins[0]];
  }
  return s;
}

bool Coordinator::standsIn(const std::string& name) {
  return std::string_view(name).substr(0, kNoStandInPrefix.size()) != kNoStandInPrefix;
}

std::vector<bool> Coordinator::joinedRanks() const {
  std::vector<bool> joined(size_, false);
  for (const auto& [name, pending] : table_) {
    if (!pending.join) continue;
    for (int r = 0; r < size_; ++r) joined[r] = joined[r] || pending.by_rank[r].has_value();
  }
  return joined;
}

std::optional<Response> Coordinator::checkStall(const std::string& what, OpType type, const std::string& name,
                                                const std::vector<bool>& has, Clock::time_point first_seen,
                                                bool& warned, Clock::time_point now) {
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - first_seen);
  if (waited < stall_warning_ && waited < timeout_) return std::nullopt;
  std::vector<int> ready, missing;
  for (int r = 0; r < size_; ++r) (has[r] ? ready : missing).push_back(r);
  const std::string where = scope_.empty() ? what : strCat(what, " in ", scope_);
  if (waited >= timeout_) {
    Response s;
    s.type = type;
    s.name = name;
    s.error = strCat(where, ": ranks ", rankList(missing), " did not submit it within ", seconds(timeout_),
                     " s (HVDTORCH_TIMEOUT) while ranks ", rankList(ready),
                     " waited for it; the ranks have diverged (different op order, an uneven "
                     "number of batches, or a rank that stopped)");
    return s;
  }
  if (!warned) {
    warned = true;
    warn_(strCat("hvdtorch: stall: ", where, " has waited ", seconds(waited), " s: ready on ranks ", rankList(ready),
                 ", missing on ranks ", rankList(missing)));
  }
  return std::nullopt;
}

std::vector<bool> Coordinator::submitted(const std::string& name, const Pending& pending, const ResponseCache& cache,
                                         const BitRanks& bit_ranks, const std::vector<bool>& joined) const {
  const int id = cache.idOf(name);
  const auto bits = id >= 0 ? bit_ranks.find(static_cast<uint32_t>(id)) : bit_ranks.end();
  const bool stand_in = !pending.join && standsIn(name);
  std::vector<bool> has(size_);
  for (int r = 0; r < size_; ++r)
    has[r] = pending.by_rank[r].has_value() || (bits != bit_ranks.end() && bits->second[r]) || (stand_in && joined[r]);
  return has;
}

void Coordinator::ranFromCache(const std::vector<uint32_t>& ids) {
  for (uint32_t id : ids) bits_.erase(id);
}

void Coordinator::takeMessages(const std::vector<RankMessage>& msgs, Clock::time_point now, ResponseList& out) {
  for (int r = 0; r < size_; ++r) {
    // A rank stopping on an error wins over one stopping normally: its
    // message is what the other ranks need to see.
    if (msgs[r].shutdown && (!out.shutdown || (out.shutdown_reason.empty() && !msgs[r].failure.empty()))) {
      out.shutdown = true;
      out.shutdown_rank = r;
      out.shutdown_reason = msgs[r].failure;
    }
    for (const Request& q : msgs[r].uncached) {
      auto [it, inserted] = table_.try_emplace(q.name);
      if (inserted) {
        it->second.by_rank.resize(size_);
        it->second.first_seen = now;
        it->second.arrival = next_arrival_++;
      }
      it->second.by_rank[r] = q;
      if (opSpec(q.type).while_joined == WhileJoined::kIsJoin) {
        it->second.join = true;
        last_joined_ = r;  // ranks in order within a cycle: the highest of a cycle's joins is last
      }
    }
  }
}

Coordinator::BitRanks Coordinator::bitRanks(const std::vector<RankMessage>& msgs, const ResponseCache& cache) const {
  BitRanks bit_ranks;
  for (uint32_t id = 0; id < cache.size(); ++id) {
    std::vector<bool> has(size_, false);
    bool any = false;
    for (int r = 0; r < size_; ++r) {
      if (bitSet(msgs[r].cache_bits, id)) {
        has[r] = true;
        any = true;
      }
    }
    if (any) bit_ranks.emplace(id, std::move(has));
  }
  return bit_ranks;
}

void Coordinator::readyFromTable(const ResponseCache& cache, BitRanks& bit_ranks, const std::vector<bool>& joined,
                                 std::vector<Response>& ready, std::optional<Response>& join_done) {
  std::vector<std::pair<uint64_t, std::string>> complete;
  for (auto& [name, pending] : table_) {
    const std::vector<bool> has = submitted(name, pending, cache, bit_ranks, joined);
    if (std::all_of(has.begin(), has.end(), [](bool b) { return b; })) complete.emplace_back(pending.arrival, name);
  }
  std::sort(complete.begin(), complete.end());
  for (const auto& [arrival, name] : complete) {
    Pending& pending = table_[name];
    const int id = cache.idOf(name);
    const auto bits = id >= 0 ? bit_ranks.find(static_cast<uint32_t>(id)) : bit_ranks.end();
    std::vector<Request> reqs(size_);
    std::vector<int> stand_ins;
    const Request* model = nullptr;
    for (int r = 0; r < size_; ++r) {
      if (const auto& req = pending.by_rank[r]) {
        reqs[r] = *req;
        if (!model) model = &*req;
      } else if (bits != bit_ranks.end() && bits->second[r]) {
        reqs[r] = cache.at(id);
      } else {
        stand_ins.push_back(r);  // joined
      }
    }
    for (int r : stand_ins) reqs[r] = model ? *model : cache.at(id);
    Response s = makeResponse(std::move(reqs), stand_ins);
    if (pending.join) {
      join_done = std::move(s);
    } else {
      ready.push_back(std::move(s));
    }
    if (bits != bit_ranks.end()) bit_ranks.erase(bits);  // consumed here
    table_.erase(name);
  }
}

void Coordinator::readyFromBits(const ResponseCache& cache, BitRanks& bit_ranks, const std::vector<bool>& joined,
                                ResponseList& out) {
  for (auto it = bit_ranks.begin(); it != bit_ranks.end();) {
    std::vector<int> stand_ins;
    bool ready = true;
    const bool stand_in = standsIn(cache.at(it->first).name);
    for (int r = 0; r < size_; ++r) {
      if (it->second[r]) continue;
      if (stand_in && joined[r]) {
        stand_ins.push_back(r);
      } else {
        ready = false;
      }
    }
    if (!ready) {
      ++it;
      continue;
    }
    if (stand_ins.empty()) {
      out.cached_ready.push_back(it->first);
    } else {
      out.responses.push_back(makeResponse(std::vector<Request>(size_, cache.at(it->first)), stand_ins));
    }
    bits_.erase(it->first);
    it = bit_ranks.erase(it);
  }
}

void Coordinator::checkTableStalls(const ResponseCache& cache, BitRanks& bit_ranks, const std::vector<bool>& joined,
                                   Clock::time_point now, std::vector<Response>& failed) {
  for (auto it = table_.begin(); it != table_.end();) {
    Pending& pending = it->second;
    if (pending.join) {  // waits, silently, for as long as the others have data
      ++it;
      continue;
    }
    const std::vector<bool> has = submitted(it->first, pending, cache, bit_ranks, joined);
    const int id = cache.idOf(it->first);
    const auto bits = id >= 0 ? bit_ranks.find(static_cast<uint32_t>(id)) : bit_ranks.end();
    OpType type = OpType::kAllreduce;
    std::string what;
    for (int r = 0; r < size_; ++r) {
      if (const auto& req = pending.by_rank[r]) {
        type = req->type;
        if (what.empty()) what = req->describe();
      }
    }
    auto err = checkStall(what, type, it->first, has, pending.first_seen, pending.warned, now);
    if (bits != bit_ranks.end()) bit_ranks.erase(bits);  // timed here, not again as a bare bit
    if (err) {
      failed.push_back(std::move(*err));
      it = table_.erase(it);
    } else {
      ++it;
    }
  }
}

void Coordinator::checkBitStalls(const ResponseCache& cache, const BitRanks& bit_ranks, Clock::time_point now,
                                 std::vector<Response>& failed) {
  for (auto& [id, has] : bit_ranks) {
    auto [st, inserted] = bits_.try_emplace(id);
    const Request& q = cache.at(id);
    if (inserted || st->second.name != q.name) st->second = BitState{now, false, q.name};
    auto err = checkStall(q.describe(), q.type, q.name, has, st->second.first_seen, st->second.warned, now);
    if (err) {
      failed.push_back(std::move(*err));
      bits_.erase(st);
    }
  }
  // Forget bit timers for ops nobody reports any more.
  for (auto it = bits_.begin(); it != bits_.end();) it = bit_ranks.count(it->first) ? std::next(it) : bits_.erase(it);
}

ResponseList Coordinator::process(const std::vector<RankMessage>& msgs, const ResponseCache& cache,
                                  Clock::time_point now) {
  ResponseList out;
  takeMessages(msgs, now, out);
  const std::vector<bool> joined = joinedRanks();
  BitRanks bit_ranks = bitRanks(msgs, cache);
  std::optional<Response> join_done;  // goes last: the ops that joined ranks stood in for run first
  readyFromTable(cache, bit_ranks, joined, out.responses, join_done);
  readyFromBits(cache, bit_ranks, joined, out);
  checkTableStalls(cache, bit_ranks, joined, now, out.responses);
  checkBitStalls(cache, bit_ranks, now, out.responses);
  if (join_done) out.responses.push_back(std::move(*join_done));
  return out;
}

}  // namespace hvdtorch
