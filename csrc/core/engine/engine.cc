#include "engine/engine.h"

#include <algorithm>
#include <cstdio>

#include "common/error.h"
#include "device/devices.h"
#include "engine/execution/device_tensor.h"
#include "engine/execution/fusion.h"
#include "engine/negotiation/control_frame.h"
#include "transport/shm/link.h"
#include "transport/shm/segment.h"
#include "transport/shm/wait.h"

namespace hvdtorch {

namespace {

// The device router's part of the configuration (the device ring, the
// device calibration) and the executor's (the staging segments), alike for
// every set's.
DeviceRouterOptions routerOptions(const Config& config) {
  DeviceRouterOptions o;
  o.device_ring = {config.device_ring, config.device_ring_slot_bytes};
  o.calibration_bytes = config.device_calibration_bytes;
  return o;
}

ExecutorOptions executorOptions(const Config& config) {
  ExecutorOptions o;
  o.staging_segment_bytes = config.staging_segment_bytes;
  return o;
}

}  // namespace

Engine::Engine(Config config, const Topology& topo, const Transports& transports, const std::vector<OpSpec>& ops)
    : config_(std::move(config)),
      timeline_(config_.timeline, topo.rank),
      control_ctx_(topo, transports.control, localLinks(config_, topo, transports, "c"), nullptr, config_.timeout),
      data_ctx_(topo, transports.data, localLinks(config_, topo, transports, "d"), transports.native, config_.timeout),
      registered_(makeRegistered(config_, topo, transports.shm_token)),
      router_(data_ctx_, reducerEnv(config_, transports.shm_token, 0, registered_), routerOptions(config_)),
      executor_(data_ctx_, router_, timeline_, registered_, executorOptions(config_)),
      control_(control_ctx_),
      shm_token_(transports.shm_token) {
  useOpTable(ops);
  std::vector<int> everyone(topo.size);
  for (int r = 0; r < topo.size; ++r) everyone[r] = r;
  global_ = newSet(0, std::move(everyone), topo.rank);
  equipSet(*global_);
  sets_.emplace(0, global_);
  fusion_threshold_ = config_.fusion_threshold;
  cycle_time_us_ = config_.cycle_time.count();
  // Shared-memory waits may spin a while when every rank of this host has
  // a core of its own (transport/shm/wait.h says why, and why not otherwise).
  const unsigned cores = std::thread::hardware_concurrency();
  setShmSpinBudget(cores != 0 && static_cast<unsigned>(topo.local_size) <= cores ? kShmSpinBudget
                                                                                 : std::chrono::microseconds(0));
  // Every rank constructs its engine in init(), so this collective lines up.
  if (config_.calibrate) router_.reducers().calibrate(data_ctx_);
  control_thread_ = std::thread([this] { controlLoop(); });
  executor_thread_ = std::thread([this] { executorLoop(); });
}

Engine::~Engine() { shutdown(); }

std::shared_ptr<RegisteredMemory> Engine::makeRegistered(const Config& config, const Topology& topo,
                                                         const std::string& shm_token) {
  if (!config.shm || shm_token.empty() || topo.local_size < 2) return nullptr;
  return std::make_shared<RegisteredMemory>(makeShmPrefix(shm_token + "g"), topo.rank, topo.local_ranks);
}

ReducerEnv Engine::reducerEnv(const Config& config, const std::string& shm_token, int32_t set_id,
                              std::shared_ptr<RegisteredMemory> registered) {
  ReducerEnv env;
  env.registered = std::move(registered);
  env.ring = RingOptions{config.ring_segment_bytes, config.ring_window};
  env.central = CentralOptions{config.central_shards, config.ring_segment_bytes};
  // Each set's node reducer has an arena of its own (its members only).
  if (config.shm && !shm_token.empty())
    env.shm_prefix = makeShmPrefix(shm_token + "n" + (set_id == 0 ? "" : std::to_string(set_id) + "s"));
  return env;
}

Context::LinkFactory Engine::localLinks(const Config& config, const Topology& topo, const Transports& t,
                                        const std::string& plane) {
  if (!config.shm) return nullptr;
  if (t.local) return t.local;
  if (t.shm_token.empty()) return nullptr;
  ShmLinkConfig cfg;
  cfg.prefix = makeShmPrefix(t.shm_token + plane);
  cfg.timeout = config.timeout;
  const int rank = topo.rank;
  return [cfg, rank](int peer) { return makeShmLink(cfg, rank, peer); };
}

// ---- process sets ------------------------------------------------------------

int32_t Engine::addProcessSet(std::vector<int> ranks, NativeCollectives* native) {
  const Topology& t = topo();
  std::sort(ranks.begin(), ranks.end());
  if (ranks.empty()) throw InvalidArgument(strCat("rank ", t.rank, ": a process set needs at least one rank"));
  if (std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end())
    throw InvalidArgument(strCat("rank ", t.rank, ": a process set lists rank ",
                                 *std::adjacent_find(ranks.begin(), ranks.end()), " twice"));
  if (ranks.front() < 0 || ranks.back() >= t.size)
    throw InvalidArgument(strCat("rank ", t.rank, ": process set rank ",
                                 ranks.front() < 0 ? ranks.front() : ranks.back(), " is not a rank in [0, ", t.size,
                                 ")"));
  std::lock_guard<std::mutex> lock(sets_mu_);
  for (const auto& [id, other] : sets_)
    if (other->ranks == ranks)
      throw InvalidArgument(strCat("rank ", t.rank, ": ", other->describe(), " already has these ranks"));
  int32_t id = 1;
  while (sets_.count(id)) ++id;
  auto ps = newSet(id, std::move(ranks), t.rank);
  ps->native = native;
  if (ps->member()) equipSet(*ps);
  sets_.emplace(id, std::move(ps));
  return id;
}

std::shared_ptr<ProcessSet> Engine::newSet(int32_t id, std::vector<int> ranks, int rank) {
  auto ps = std::make_shared<ProcessSet>();
  ps->id = id;
  ps->ranks = std::move(ranks);
  const auto me = std::find(ps->ranks.begin(), ps->ranks.end(), rank);
  ps->set_rank = me == ps->ranks.end() ? -1 : static_cast<int>(me - ps->ranks.begin());
  return ps;
}

void Engine::equipSet(ProcessSet& ps) {
  if (ps.id == 0) {  // the engine's own parts
    ps.control = &control_ctx_;
    ps.data = &data_ctx_;
    ps.router = &router_;
    ps.executor = &executor_;
    ps.plane = &control_;
  } else {  // views of the engine's contexts, and parts of its own
    ps.own_control = Context::view(control_ctx_, ps.ranks);
    ps.own_data = Context::view(data_ctx_, ps.ranks, ps.native);
    ps.own_router = std::make_unique<Router>(*ps.own_data, reducerEnv(config_, shm_token_, ps.id, registered_),
                                             routerOptions(config_));
    // The job's calibration, alike on every member.
    ps.own_router->reducers().adoptModel(router_.reducers().calibrated(), *ps.own_data);
    ps.own_executor =
        std::make_unique<Executor>(*ps.own_data, *ps.own_router, timeline_, registered_, executorOptions(config_));
    ps.own_plane = std::make_unique<ControlPlane>(*ps.own_control);
    ps.control = ps.own_control.get();
    ps.data = ps.own_data.get();
    ps.router = ps.own_router.get();
    ps.executor = ps.own_executor.get();
    ps.plane = ps.own_plane.get();
  }
  ps.cache = std::make_unique<ResponseCache>(config_.cache_capacity);
  if (ps.set_rank == 0) {
    ps.coordinator = std::make_unique<Coordinator>(static_cast<int>(ps.ranks.size()), config_.stall_warning,
                                                   config_.timeout, [this](const std::string& m) { warn(m); });
    if (ps.id != 0) ps.coordinator->setScope(ps.ranks, ps.describe());
  }
}

void Engine::removeProcessSet(int32_t id) {
  const int me = topo().rank;
  if (id == 0) throw InvalidArgument(strCat("rank ", me, ": the global process set (0) cannot be removed"));
  std::shared_ptr<ProcessSet> removed;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    auto it = sets_.find(id);
    if (it == sets_.end()) throw InvalidArgument(strCat("rank ", me, ": process set ", id, " does not exist"));
    if (it->second->outstanding > 0)
      throw InvalidArgument(strCat("rank ", me, ": ", it->second->describe(), " still has ",
                                   it->second->outstanding.load(),
                                   " op(s) in flight on this rank; synchronize them before removing it"));
    removed = it->second;
    sets_.erase(it);
  }
  // Nothing of the set is left to run here or on its peers, and nothing else
  // runs until every member is through (the contract in engine.h), so its
  // device rings can take the teardown handshake instead of freeing an inbox
  // a peer may still have mapped.
  if (removed->member() && removed->router) removed->router->closeRings();
}

std::shared_ptr<const ProcessSet> Engine::processSet(int32_t id) const { return findSet(id); }

std::vector<std::shared_ptr<const ProcessSet>> Engine::processSets() const {
  const auto sets = setsSnapshot();
  return {sets.begin(), sets.end()};
}

std::shared_ptr<ProcessSet> Engine::findSet(int32_t id) const {
  std::lock_guard<std::mutex> lock(sets_mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<ProcessSet>> Engine::setsSnapshot() const {
  std::lock_guard<std::mutex> lock(sets_mu_);
  std::vector<std::shared_ptr<ProcessSet>> out;
  out.reserve(sets_.size());
  for (const auto& [id, ps] : sets_) out.push_back(ps);
  return out;
}

void Engine::warn(const std::string& msg) { std::fprintf(stderr, "%s\n", msg.c_str()); }

int64_t Engine::submit(EntryPtr entry) {
  const Request& req = entry->request;
  std::shared_ptr<ProcessSet> ps = findSet(req.process_set_id);
  if (!ps)
    throw InvalidArgument(strCat("rank ", topo().rank, ": ", opTypeName(req.type), " '", req.name, "': process set ",
                                 req.process_set_id, " does not exist (never added, or removed)"));
  if (!ps->member())
    throw InvalidArgument(strCat("rank ", topo().rank, ": ", opTypeName(req.type), " '", req.name,
                                 "': ", ps->describe(), " does not include this rank"));
  std::unique_lock<std::mutex> lock(mu_);
  if (!failure_.empty()) throw CollectiveError(strCat(req.describe(), ": ", failure_));
  if (!entry->inputs.empty())
    device_index_[entry->inputs.front()->device().kind] = entry->inputs.front()->device().index;
  if (shutdown_requested_ || stopped_)
    throw CollectiveError(strCat("rank ", topo().rank, ": hvdtorch has been shut down; call hvdtorch.init() again"));
  std::string key = strCat(req.process_set_id, ":", req.name);
  if (!pending_names_.insert(key).second)
    throw InvalidArgument(strCat("rank ", topo().rank, ": ", opTypeName(req.type), " named '", req.name,
                                 "' is already pending", req.process_set_id ? " in " + ps->describe() : "",
                                 "; names of outstanding ops must be unique"));
  // The name stays taken until the op finishes (not merely until it is
  // negotiated): a second op of the same name could otherwise be accepted
  // while the first one still runs, and the two would be matched with the
  // wrong peers' ops.
  ++ps->outstanding;
  entry->state->setOnDone([this, key = std::move(key), set = std::weak_ptr<ProcessSet>(ps)] {
    if (auto p = set.lock()) --p->outstanding;
    std::lock_guard<std::mutex> lock(mu_);
    pending_names_.erase(key);
  });
  const int64_t handle = next_handle_++;
  handles_.emplace(handle, entry->state);
  timeline_.begin(req.name, "NEGOTIATE");
  entry->state->times.submitted = OpTimes::now();
  incoming_.push_back(std::move(entry));
  lock.unlock();  // the control thread wakes to take mu_: notify once it is free
  incoming_cv_.notify_one();
  return handle;
}

std::shared_ptr<OpState> Engine::state(int64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handles_.find(handle);
  if (it == handles_.end()) throw InvalidArgument(strCat("unknown or already released handle ", handle));
  return it->second;
}

void Engine::release(int64_t handle) {
  std::shared_ptr<OpState> st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handles_.find(handle);
    if (it == handles_.end()) return;
    st = std::move(it->second);
    handles_.erase(it);
  }
  if (st->done()) latency_.add(st->times);
}

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_requested_ = true;
  }
  incoming_cv_.notify_all();
  if (control_thread_.joinable()) control_thread_.join();
  {
    std::lock_guard<std::mutex> lock(exec_mu_);
    exec_stop_ = true;
  }
  exec_cv_.notify_all();
  if (executor_thread_.joinable()) executor_thread_.join();
  settleHeld();  // both threads are gone: nothing can bring a cause any more
  timeline_.close();
  // After a last word, keep the control links open a little: a peer that
  // was about to exchange with this rank reads the last word (and learns
  // the real cause) instead of finding the connection closed.
  std::this_thread::sleep_until(linger_until_);
  // Nothing runs any more: let go of the transports now, not when the last
  // owner of this engine (a DistributedModel, say) goes away, so that
  // shutdown() leaves no process group thread or socket behind.
  control_ctx_.close();
  control_.dropPosted();
  data_ctx_.close();
}

void Engine::failEverything(const std::string& why) {
  std::deque<EntryPtr> incoming;
  std::deque<QueuedUnit> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.empty()) failure_ = why;
    incoming.swap(incoming_);
    pending_names_.clear();
  }
  {
    std::lock_guard<std::mutex> lock(exec_mu_);
    queued.swap(exec_queue_);
  }
  // Each op's error names the op as well as the cause.
  for (auto& e : incoming) e->state->fail(strCat(e->request.describe(), ": ", why));
  for (auto& q : queued)
    for (auto& p : q.unit.pieces) p.entry->state->fail(strCat(p.entry->request.describe(), ": ", why));
}

void Engine::failNegotiating(const std::function<std::string(const EntryPtr&)>& why) {
  for (const auto& ps : setsSnapshot()) {
    for (auto& e : ps->fresh) e->state->fail(why(e));
    for (auto& [name, e] : ps->pending) e->state->fail(why(e));
    ps->fresh.clear();
    ps->pending.clear();
    ps->cached_pending.clear();
  }
}

void Engine::controlLoop() {
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
      for (const auto& ps : setsSnapshot()) waiting = waiting || ps->busy();
      std::unique_lock<std::mutex> lock(mu_);
      const auto wait = waiting ? cycleTime() : std::chrono::duration_cast<std::chrono::microseconds>(kIdleWait);
      incoming_cv_.wait_for(lock, wait, [&] { return !incoming_.empty() || shutdown_requested_; });
    }
    try {
      runCycle();
      std::lock_guard<std::mutex> lock(mu_);
      stop = stopped_;
    } catch (const PeerStopped& e) {
      // A peer's last word where its message was expected: pass its cause on.
      onNegotiationFailure(strCat("rank ", control_ctx_.rank(), ": ", e.what()));
      stop = true;
    } catch (const std::exception& e) {
      onNegotiationFailure(
          strCat("rank ", control_ctx_.rank(), ": lost contact with the other ranks during negotiation: ", e.what()));
      stop = true;
    }
    settleHeld();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  settleHeld();  // no cause can come any more
}

std::chrono::milliseconds Engine::reasonGrace() const {
  return std::min<std::chrono::milliseconds>(config_.timeout / 4, std::chrono::seconds(1));
}

void Engine::settleHeld() {
  std::vector<HeldUnit> held;
  std::string cause;
  bool own = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (held_.empty()) return;
    if (failure_.empty()) {
      if (!stopped_ && std::chrono::steady_clock::now() < held_until_) return;
      // No cause came: the peer closed without a word (it died, most
      // likely). Blame it, as the first held unit saw it.
      failure_ = held_.front().failed + held_.front().seen;
      own = true;
    }
    cause = failure_;
    held.swap(held_);
  }
  if (own) {
    failEverything(cause);
    incoming_cv_.notify_all();  // the control thread tells the other ranks
  }
  for (auto& h : held) {
    for (auto& p : h.item.unit.pieces) {
      if (h.seen.empty()) {
        p.entry->state->fail(strCat(p.entry->request.describe(), ": ", cause));
      } else if (own) {
        p.entry->state->fail(h.failed + h.seen);
      } else {
        p.entry->state->fail(strCat(h.failed, cause, " (then: ", h.seen, ")"));
      }
    }
  }
}

void Engine::onNegotiationFailure(const std::string& why) {
  failEverything(why);
  std::string reason;  // the first failure on this rank, which may predate this one
  {
    std::lock_guard<std::mutex> lock(mu_);
    reason = failure_;
  }
  failNegotiating([&](const EntryPtr& e) { return strCat(e->request.describe(), ": ", reason); });
  // The other ranks only see this rank go away, wherever they wait for it
  // (rank 0's reply in the star, a vector in the AND): tell them what it saw.
  ResponseList last;
  last.shutdown = true;
  last.shutdown_rank = control_ctx_.rank();
  constexpr size_t kMaxReason = 3000;  // the last word is one control frame
  last.shutdown_reason = reason.size() > kMaxReason ? reason.substr(0, kMaxReason) + " [...]" : reason;
  control_.sendLastWord(last.serialize());
  linger_until_ = std::chrono::steady_clock::now() + reasonGrace();
}

void Engine::prepareMessage(ProcessSet& ps, RankMessage& msg) {
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

// ---- negotiation: the decentralized AND, the star when someone needs it ------

namespace {
// The AND vector: [status | idle sets (global set only) | cache bits].
// Every bit means "fine with me", so that the AND answers "fine with
// everyone": an op's bit survives when every rank has it pending, the
// status bit when no rank needs the coordinator, a set's idle bit when no
// rank has work in that set.
constexpr uint64_t kNoCoordinator = 1;
constexpr int32_t kIdleBits = 64;  // sets 1..63 travel in the AND; busy ones past that need the star
}  // namespace

std::chrono::milliseconds Engine::coordinatorGrace() const {
  auto limit = config_.timeout;
  if (config_.stall_warning.count() > 0) limit = std::min(limit, config_.stall_warning);
  return std::min<std::chrono::milliseconds>(std::chrono::milliseconds(100), limit / 10);
}

bool Engine::needsCoordinator(const ProcessSet& ps, const RankMessage& msg) const {
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

ResponseList Engine::negotiate(ProcessSet& ps, const RankMessage& msg) {
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

ResponseList Engine::starExchange(ProcessSet& ps, const RankMessage& msg) {
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

std::vector<ReadyOp> Engine::takeReady(ProcessSet& ps, const ResponseList& list) {
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

EntryPtr Engine::makeStandIn(const Request& req) {
  // Zeros in, outputs dropped, on a device of the kind the peers' tensors
  // are on, so the op runs through the same staging (and, for device-native
  // reducers, the same device calls) as theirs. Host memory where this
  // process cannot make such a device: the host reducers run on it alike.
  Device* dev = nullptr;
  const DeviceKind kind = req.tensors.empty() ? DeviceKind::kCpu : req.tensors.front().device;
  if (kind != DeviceKind::kCpu) {
    int index = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = device_index_.find(kind);
      if (it != device_index_.end()) index = it->second;
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

bool Engine::runsInline(const WorkUnit& unit) {
  if (!unit.error.empty()) return true;  // only fails its ops
  switch (opSpec(unit.type).inline_run) {
    case InlineRun::kIfSmall: return unit.bytes <= kInlineUnitBytes;
    case InlineRun::kAlways: return true;
    case InlineRun::kNever: break;
  }
  return false;
}

void Engine::queueUnits(const std::shared_ptr<ProcessSet>& ps, std::vector<ReadyOp> ready) {
  if (ready.empty()) return;
  for (const auto& op : ready) {
    if (!op.entry) continue;
    timeline_.end(op.entry->request.name, "NEGOTIATE");
    timeline_.begin(op.entry->request.name, "QUEUE");
  }
  std::vector<WorkUnit> units = planWork(ready, fusionThreshold());
  size_t next = 0;
  // A small unit runs right here when the executor has nothing before it:
  // that saves the op a thread hand-off (a wake-up and a context switch)
  // worth more than the unit itself. Order is kept, because the executor
  // is idle and its queue empty, and only this thread queues. Large units
  // go to the executor, so that the next cycle's negotiation overlaps them.
  while (next < units.size() && runsInline(units[next])) {
    {
      std::lock_guard<std::mutex> lock(exec_mu_);
      if (!exec_queue_.empty() || exec_busy_) break;
      exec_busy_ = true;
    }
    QueuedUnit item{ps, std::move(units[next++])};
    runUnit(item);
    std::lock_guard<std::mutex> lock(exec_mu_);
    exec_busy_ = false;
  }
  if (next == units.size()) return;
  {
    std::lock_guard<std::mutex> lock(exec_mu_);
    for (; next < units.size(); ++next) exec_queue_.push_back({ps, std::move(units[next])});
  }
  exec_cv_.notify_one();
}

void Engine::runCycle() {
  timeline_.markCycle();
  RankMessage msg;
  std::deque<EntryPtr> fresh = takeIncoming(msg);
  const auto sets = setsSnapshot();  // ascending ids, the global set first
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
    auto ps = findIn(sets, id);
    if (ps && ps->member()) runSetCycle(ps);
  }
}

std::deque<EntryPtr> Engine::takeIncoming(RankMessage& msg) {
  std::deque<EntryPtr> fresh;
  std::lock_guard<std::mutex> lock(mu_);
  fresh.swap(incoming_);
  const auto picked = OpTimes::now();
  for (auto& e : fresh) e->state->times.picked = picked;
  msg.shutdown = shutdown_requested_ || !failure_.empty();
  msg.failure = failure_;
  return fresh;
}

std::shared_ptr<ProcessSet> Engine::findIn(const std::vector<std::shared_ptr<ProcessSet>>& sets, int32_t id) {
  for (const auto& ps : sets)
    if (ps->id == id) return ps;
  return nullptr;
}

void Engine::sortIntoSets(std::deque<EntryPtr> fresh, const std::vector<std::shared_ptr<ProcessSet>>& sets) {
  const int me = control_ctx_.rank();
  for (auto& e : fresh) {
    auto ps = findIn(sets, e->request.process_set_id);
    if (!ps) {  // removed between submit and now
      e->state->fail(strCat("rank ", me, ": ", e->request.describe(), ": process set ", e->request.process_set_id,
                            " was removed"));
      continue;
    }
    ps->fresh.push_back(std::move(e));
  }
}

void Engine::stopOnShutdown(const ResponseList& list) {
  const int me = control_ctx_.rank();
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
    std::lock_guard<std::mutex> lock(mu_);
    late.swap(incoming_);
    pending_names_.clear();
    stopped_ = true;
    if (!list.shutdown_reason.empty() && failure_.empty()) failure_ = strCat("rank ", me, ": ", reason);
  }
  if (list.shutdown_reason.empty()) {
    // A clean stop, on every rank in this cycle: the device rings' teardown
    // handshake can rely on every peer taking part.
    std::lock_guard<std::mutex> lock(exec_mu_);
    close_device_rings_ = true;
  }
  exec_cv_.notify_all();
  for (auto& e : late) e->state->fail(why(e));
}

void Engine::runSetCycle(const std::shared_ptr<ProcessSet>& ps) {
  RankMessage msg;  // sets never carry shutdown: the global exchange does
  prepareMessage(*ps, msg);
  queueUnits(ps, takeReady(*ps, negotiate(*ps, msg)));
}

void Engine::executorLoop() {
  while (true) {
    QueuedUnit item;
    {
      std::unique_lock<std::mutex> lock(exec_mu_);
      const auto woken = [&] { return !exec_queue_.empty() || exec_stop_ || close_device_rings_; };
      if (settle_at_ == std::chrono::steady_clock::time_point::max()) {
        exec_cv_.wait(lock, woken);
      } else if (!exec_cv_.wait_until(lock, settle_at_, woken)) {
        // Units are held and their grace ended (the control thread may be
        // stuck in an exchange): settle them.
        settle_at_ = std::chrono::steady_clock::time_point::max();
        lock.unlock();
        settleHeld();
        continue;
      }
      if (exec_queue_.empty() && close_device_rings_) {
        // Every rank stopped in the same cycle, after queueing the same units:
        // all ran, unless one failed here (then the links may be out of step).
        close_device_rings_ = false;
        lock.unlock();
        bool failed;
        {
          std::lock_guard<std::mutex> failure_lock(mu_);
          failed = !failure_.empty();
        }
        if (!failed)
          for (const auto& ps : setsSnapshot())
            if (ps->member() && ps->router) ps->router->closeRings();
        continue;
      }
      if (exec_queue_.empty()) return;  // stop requested and everything drained
      item = std::move(exec_queue_.front());
      exec_queue_.pop_front();
      exec_busy_ = true;
    }
    runUnit(item);
    std::lock_guard<std::mutex> lock(exec_mu_);
    exec_busy_ = false;
  }
}

void Engine::runUnit(QueuedUnit& item) {
  WorkUnit& unit = item.unit;
  std::string failure;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failure = failure_;
    if (failure.empty() && !held_.empty()) {
      // A link closed under an earlier unit: this one would fail or stall
      // on it. It fails with that unit's cause.
      held_.push_back({std::move(item), "", ""});
      return;
    }
  }
  const Request& req = unit.pieces.front().entry->request;
  const int me = data_ctx_.rank();
  try {
    if (!failure.empty()) {
      for (auto& p : unit.pieces) p.entry->state->fail(strCat(p.entry->request.describe(), ": ", failure));
      return;
    }
    const auto started = OpTimes::now();
    for (auto& p : unit.pieces) p.entry->state->times.started = started;
    item.set->executor->run(unit);
  } catch (const InvalidArgument& e) {
    for (auto& p : unit.pieces) p.entry->state->fail(strCat("rank ", me, ": ", e.what()));
  } catch (const std::exception& e) {
    const std::string in_set = item.set->id == 0 ? "" : " in " + item.set->describe();
    const std::string failed =
        strCat("rank ", me, ": ", opTypeName(unit.type), " '", req.name, "'", in_set, " failed: ");
    std::string cause;
    std::chrono::steady_clock::time_point settle_at{};
    {
      std::lock_guard<std::mutex> lock(mu_);
      cause = failure_;
      if (cause.empty() && !stopped_ && dynamic_cast<const PeerClosed*>(&e) != nullptr) {
        // The peer may have closed because it learned of a failure
        // elsewhere, and its reason may still be on its way: hold the
        // unit until the control thread knows (settleHeld()).
        if (held_.empty()) held_until_ = std::chrono::steady_clock::now() + reasonGrace();
        settle_at = held_until_;
        held_.push_back({std::move(item), failed, e.what()});
      }
    }
    if (settle_at != std::chrono::steady_clock::time_point{}) {
      {
        std::lock_guard<std::mutex> lock(exec_mu_);
        settle_at_ = settle_at;
      }
      exec_cv_.notify_all();
      incoming_cv_.notify_all();  // an idle control thread cycles now, and hears sooner
      return;
    }
    // A cause the control thread already knows leads; what this unit saw follows.
    const std::string why = cause.empty() ? failed + e.what() : strCat(failed, cause, " (then: ", e.what(), ")");
    for (auto& p : unit.pieces) p.entry->state->fail(why);
    failEverything(why);
    incoming_cv_.notify_all();  // the control thread tells the other ranks
  }
}

}  // namespace hvdtorch
