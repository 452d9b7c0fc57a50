#include "engine/negotiation/controller.h"

#include <algorithm>

#include "common/error.h"
#include "common/thread_placement.h"
#include "device/devices.h"
#include "engine/execution/device_tensor.h"
#include "engine/negotiation/control_frame.h"
#include "engine/op_spec.h"

namespace hvdtorch {

namespace {
// The AND vector: [status | idle sets (global set only) | cache bits].
// Every bit means "fine with me", so that the AND answers "fine with
// everyone": an op's bit survives when every rank has it pending, the
// status bit when no rank needs the coordinator, a set's idle bit when no
// rank has work in that set.
constexpr uint64_t kNoCoordinator = 1;
constexpr int32_t kIdleBits = 64;  // sets 1..63 travel in the AND; busy ones past that need the star
}  // namespace

Controller::Controller(const Config& config, EngineState& state, ProcessSetTable& sets, WorkQueue& work,
                       Timeline& timeline)
    : config_(config),
      st_(state),
      sets_(sets),
      work_(work),
      timeline_(timeline),
      global_(sets.global()),
      rank_(sets.global()->control->rank()),
      fusion_threshold_(config.fusion_threshold),
      cycle_time_us_(config.cycle_time.count()) {}

void Controller::start() {
  thread_ = std::thread([this] {
    placeEngineThread("hvd-control");
    loop();
  });
}

void Controller::join() {
  if (thread_.joinable()) thread_.join();
}

std::chrono::milliseconds Controller::coordinatorGrace() const {
  auto limit = config_.timeout;
  if (config_.stall_warning.count() > 0) limit = std::min(limit, config_.stall_warning);
  return std::min<std::chrono::milliseconds>(std::chrono::milliseconds(100), limit / 10);
}

void Controller::loop() {
  bool stop = false;
  while (!stop) {
    {
      // A rank with ops awaiting an answer runs a cycle every cycle_time,
      // and so does every rank while some process set has work anywhere (its
      // members need every rank in the global exchange that starts each
      // cycle). Otherwise a rank sleeps until it gets work: an op can only
      // become ready once every rank has submitted it, and then every rank
      // is polling. Idle ranks still join a cycle every kIdleWait, which
      // bounds how late they see stall warnings, timeouts and shutdown.
      constexpr auto kIdleWait = std::chrono::milliseconds(50);
      bool waiting = others_busy_;
      for (const auto& ps : sets_.snapshot()) waiting = waiting || ps->busy();
      std::unique_lock<std::mutex> lock(st_.mu);
      const auto wait = waiting ? cycleTime() : std::chrono::duration_cast<std::chrono::microseconds>(kIdleWait);
      st_.incoming_cv.wait_for(lock, wait, [&] { return !st_.incoming.empty() || st_.shutdown_requested; });
    }
    try {
      runCycle();
      std::lock_guard<std::mutex> lock(st_.mu);
      stop = st_.stopped;
    } catch (const PeerStopped& e) {
      // A peer's last word where its message was expected: pass its cause on.
      onNegotiationFailure(strCat("rank ", rank_, ": ", e.what()));
      stop = true;
    } catch (const std::exception& e) {
      onNegotiationFailure(
          strCat("rank ", rank_, ": lost contact with the other ranks during negotiation: ", e.what()));
      stop = true;
    }
    work_.settleHeld();
  }
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    st_.stopped = true;
  }
  work_.settleHeld();  // no cause can come any more
}

void Controller::runCycle() {
  timeline_.markCycle();
  RankMessage msg;
  std::deque<EntryPtr> fresh = takeIncoming(msg);
  const auto sets = sets_.snapshot();  // ascending ids, the global set first
  sortIntoSets(std::move(fresh), sets);
  for (const auto& ps : sets)
    if (ps->id != 0 && ps->member() && ps->busy()) msg.busy_sets.push_back(ps->id);
  prepareMessage(*global_, msg);

  const ResponseList list = negotiate(*global_, msg);
  queueUnits(global_, takeReady(*global_, list));
  others_busy_ = !list.busy_sets.empty();
  if (list.shutdown) return stopOnShutdown(list);  // every rank stops here, before any set's exchange
  // Every rank got the same list: the members of each busy set meet in its
  // exchange, in id order. A set unknown here is not this rank's (a member
  // always has it: sets are added collectively before first use).
  for (int32_t id : list.busy_sets) {
    auto ps = ProcessSetTable::findIn(sets, id);
    if (ps && ps->member()) runSetCycle(ps);
  }
}

std::deque<EntryPtr> Controller::takeIncoming(RankMessage& msg) {
  std::deque<EntryPtr> fresh;
  std::lock_guard<std::mutex> lock(st_.mu);
  fresh.swap(st_.incoming);
  const auto picked = OpTimes::now();
  for (auto& e : fresh) e->state->times.picked = picked;
  msg.shutdown = st_.shutdown_requested || !st_.failure.empty();
  msg.failure = st_.failure;
  return fresh;
}

void Controller::sortIntoSets(std::deque<EntryPtr> fresh, const std::vector<std::shared_ptr<ProcessSet>>& sets) {
  const int me = rank_;
  for (auto& e : fresh) {
    auto ps = ProcessSetTable::findIn(sets, e->request.process_set_id);
    if (!ps) {  // removed between submit and now
      e->state->fail(strCat("rank ", me, ": ", e->request.describe(), ": process set ", e->request.process_set_id,
                            " was removed"));
      continue;
    }
    ps->fresh.push_back(std::move(e));
  }
}

void Controller::stopOnShutdown(const ResponseList& list) {
  const int me = rank_;
  // Name the rank that stopped and, when it stopped on an error, that error:
  // "shut down" alone would hide the real cause from everyone else.
  const std::string reason = list.shutdown_reason.empty()
                                 ? strCat("hvdtorch was shut down (shutdown() called on rank ", list.shutdown_rank,
                                          ") while this op was pending")
                                 : (list.shutdown_rank == me ? list.shutdown_reason
                                                             : strCat("stopped because rank ", list.shutdown_rank,
                                                                      " failed: ", list.shutdown_reason));
  auto why = [&](const EntryPtr& e) { return strCat("rank ", me, ": ", e->request.describe(), ": ", reason); };
  failNegotiating(why);
  std::deque<EntryPtr> late;
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    late.swap(st_.incoming);
    st_.pending_names.clear();
    st_.stopped = true;
    if (!list.shutdown_reason.empty() && st_.failure.empty()) st_.failure = strCat("rank ", me, ": ", reason);
  }
  // A clean stop (no reason given) is one on every rank in this cycle: the
  // device rings' teardown handshake can rely on every peer taking part.
  work_.stopping(list.shutdown_reason.empty());
  for (auto& e : late) e->state->fail(why(e));
}

void Controller::runSetCycle(const std::shared_ptr<ProcessSet>& ps) {
  RankMessage msg;  // sets never carry shutdown: the global exchange does
  prepareMessage(*ps, msg);
  queueUnits(ps, takeReady(*ps, negotiate(*ps, msg)));
}

void Controller::prepareMessage(ProcessSet& ps, RankMessage& msg) {
  // An op reported by its cache bit whose entry was evicted since (the cache
  // was full) is negotiated in full again.
  for (auto it = ps.cached_pending.begin(); it != ps.cached_pending.end();) {
    if (ps.cache->idOf(it->second.name) == static_cast<int>(it->first)) {
      ++it;
      continue;
    }
    msg.uncached.push_back(ps.pending.at(it->second.name)->request);
    it = ps.cached_pending.erase(it);
  }
  const auto now = std::chrono::steady_clock::now();
  for (auto& e : ps.fresh) {
    const int id = ps.cache->lookup(e->request);
    if (id >= 0) {
      ps.cached_pending[static_cast<uint32_t>(id)] = {e->request.name, now};
    } else {
      msg.uncached.push_back(e->request);
    }
    ps.pending[e->request.name] = std::move(e);
  }
  ps.fresh.clear();
  msg.cache_bits.assign(ps.cache->words(), 0);
  for (const auto& [id, op] : ps.cached_pending) msg.cache_bits[id / 64] |= uint64_t(1) << (id % 64);
}

bool Controller::needsCoordinator(const ProcessSet& ps, const RankMessage& msg) const {
  // Uncached requests, and ops sent in full in an earlier cycle and not yet
  // answered (their entry lives in the coordinator's table only).
  if (msg.shutdown || !msg.uncached.empty() || ps.pending.size() != ps.cached_pending.size()) return true;
  for (int32_t id : msg.busy_sets)
    if (id >= kIdleBits) return true;
  const auto now = std::chrono::steady_clock::now();
  const auto grace = coordinatorGrace();
  for (const auto& [id, op] : ps.cached_pending)
    if (now - op.since > grace) return true;  // the coordinator must time this wait
  return false;
}

ResponseList Controller::negotiate(ProcessSet& ps, const RankMessage& msg) {
  const bool global = ps.id == 0;
  if (config_.decentralized && ps.control->size() > 1) {
    const size_t head = global ? 2 : 1;
    std::vector<uint64_t> words(head + msg.cache_bits.size(), 0);
    if (!needsCoordinator(ps, msg)) words[0] = kNoCoordinator;
    if (global) {
      words[1] = ~uint64_t(0);
      for (int32_t id : msg.busy_sets)
        if (id < kIdleBits) words[1] &= ~(uint64_t(1) << id);
    }
    std::copy(msg.cache_bits.begin(), msg.cache_bits.end(), words.begin() + static_cast<ptrdiff_t>(head));
    ps.plane->andAll(words);
    if (words[0] & kNoCoordinator) {
      ++and_rounds_;
      ResponseList list;
      for (size_t w = head; w < words.size(); ++w)
        for (uint64_t bits = words[w]; bits != 0; bits &= bits - 1)
          list.cached_ready.push_back(static_cast<uint32_t>((w - head) * 64 + __builtin_ctzll(bits)));
      if (global)
        for (int32_t id = 1; id < kIdleBits; ++id)
          if (!(words[1] >> id & 1)) list.busy_sets.push_back(id);
      if (ps.coordinator) ps.coordinator->ranFromCache(list.cached_ready);
      return list;
    }
  }
  ++star_rounds_;
  return starExchange(ps, msg);
}

ResponseList Controller::starExchange(ProcessSet& ps, const RankMessage& msg) {
  const bool global = ps.id == 0;
  const std::vector<char> reply = ps.plane->exchange(msg.serialize(), [&](std::vector<std::vector<char>>& all) {
    std::vector<RankMessage> msgs;
    msgs.reserve(all.size());
    for (const auto& bytes : all) msgs.push_back(RankMessage::parse(bytes));
    ResponseList out = ps.coordinator->process(msgs, *ps.cache, Coordinator::Clock::now());
    if (global) {
      for (const auto& m : msgs) out.busy_sets.insert(out.busy_sets.end(), m.busy_sets.begin(), m.busy_sets.end());
      std::sort(out.busy_sets.begin(), out.busy_sets.end());
      out.busy_sets.erase(std::unique(out.busy_sets.begin(), out.busy_sets.end()), out.busy_sets.end());
    }
    return out.serialize();
  });
  return ResponseList::parse(reply);
}

std::vector<ReadyOp> Controller::takeReady(ProcessSet& ps, const ResponseList& list) {
  std::vector<ReadyOp> ready;
  const auto negotiated = OpTimes::now();
  auto take = [&](const std::string& name) -> EntryPtr {
    auto it = ps.pending.find(name);
    if (it == ps.pending.end()) return nullptr;
    EntryPtr e = std::move(it->second);
    e->state->times.negotiated = negotiated;
    ps.pending.erase(it);
    const int id = ps.cache->idOf(name);
    if (id >= 0) ps.cached_pending.erase(static_cast<uint32_t>(id));
    return e;
  };
  for (uint32_t id : list.cached_ready) {
    // Every rank submitted exactly the cached request, so its plan follows.
    const Request& cached = ps.cache->at(id);
    ps.cache->touch(id);  // in list order on every rank, so LRU order stays identical
    Response s;
    s.type = cached.type;
    s.name = cached.name;
    s.process_set_id = cached.process_set_id;
    s.plan = makePlan(std::vector<const Request*>(ps.control->size(), &cached));
    ready.push_back({std::move(s), take(cached.name)});
  }
  for (const Response& s : list.responses) {
    EntryPtr e = take(s.name);
    if (!e && s.stand_in && s.error.empty()) e = makeStandIn(*s.stand_in);
    // Every rank holds this op when it succeeded, so every rank makes the
    // same cache update in the same order.
    if (e && s.error.empty()) ps.cache->put(e->request);
    ready.push_back({s, std::move(e)});
  }
  return ready;
}

EntryPtr Controller::makeStandIn(const Request& req) {
  // Zeros in, outputs dropped, on a device of the kind the peers' tensors
  // are on, so the op runs through the same staging (and, for device-native
  // reducers, the same device calls) as theirs. Host memory where this
  // process cannot make such a device: the host reducers run on it alike.
  Device* dev = nullptr;
  const DeviceKind kind = req.tensors.empty() ? DeviceKind::kCpu : req.tensors.front().device;
  if (kind != DeviceKind::kCpu) {
    int index = 0;
    {
      std::lock_guard<std::mutex> lock(st_.mu);
      auto it = st_.device_index.find(kind);
      if (it != st_.device_index.end()) index = it->second;
    }
    try {
      dev = &deviceFor(DeviceId{kind, index});
    } catch (const std::exception&) {
      dev = nullptr;
    }
  }
  auto zeros = [dev](DataType dtype, const std::vector<int64_t>& shape) -> TensorPtr {
    if (dev) return std::make_shared<DeviceTensor>(*dev, dtype, shape);
    return std::make_shared<HostTensor>(dtype, shape);  // zero-filled
  };
  auto e = std::make_shared<Entry>();
  e->request = req;
  for (const auto& t : req.tensors) {
    e->inputs.push_back(zeros(t.dtype, t.shape));
    if (opSpec(req.type).outputs == Outputs::kLikeInputs) e->outputs.push_back(zeros(t.dtype, t.shape));
  }
  e->allocate = zeros;
  return e;
}

void Controller::queueUnits(const std::shared_ptr<ProcessSet>& ps, std::vector<ReadyOp> ready) {
  if (ready.empty()) return;
  for (const auto& op : ready) {
    if (!op.entry) continue;
    timeline_.end(op.entry->request.name, "NEGOTIATE");
    timeline_.begin(op.entry->request.name, "QUEUE");
  }
  // Aliases the set, keeping it alive until its last unit ran.
  work_.push(std::shared_ptr<const UnitSite>(ps, &ps->site), planWork(ready, fusionThreshold()));
}

void Controller::onNegotiationFailure(const std::string& why) {
  work_.failEverything(why);
  std::string reason;  // the first failure on this rank, which may predate this one
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    reason = st_.failure;
  }
  failNegotiating([&](const EntryPtr& e) { return strCat(e->request.describe(), ": ", reason); });
  // The other ranks only see this rank go away, wherever they wait for it
  // (rank 0's reply in the star, a vector in the AND): tell them what it saw.
  ResponseList last;
  last.shutdown = true;
  last.shutdown_rank = rank_;
  constexpr size_t kMaxReason = 3000;  // the last word is one control frame
  last.shutdown_reason = reason.size() > kMaxReason ? reason.substr(0, kMaxReason) + " [...]" : reason;
  global_->plane->sendLastWord(last.serialize());
  linger_until_ = std::chrono::steady_clock::now() + reasonGrace(config_);
}

void Controller::failNegotiating(const std::function<std::string(const EntryPtr&)>& why) {
  for (const auto& ps : sets_.snapshot()) {
    for (auto& e : ps->fresh) e->state->fail(why(e));
    for (auto& [name, e] : ps->pending) e->state->fail(why(e));
    ps->fresh.clear();
    ps->pending.clear();
    ps->cached_pending.clear();
  }
}

}  // namespace hvdtorch
