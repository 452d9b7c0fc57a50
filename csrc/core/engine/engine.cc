#include "engine/engine.h"

#include <algorithm>
#include <cstdio>

#include "common/error.h"
#include "engine/fusion.h"
#include "transport/shm_link.h"
#include "transport/shm_segment.h"

namespace hvdtorch {

Engine::Engine(Config config, const Topology& topo, const Transports& transports)
    : config_(std::move(config)),
      timeline_(config_.timeline, topo.rank),
      control_ctx_(topo, transports.control, localLinks(config_, topo, transports, "c"), nullptr, config_.timeout),
      data_ctx_(topo, transports.data, localLinks(config_, topo, transports, "d"), transports.native,
                config_.timeout),
      reducers_(reducerEnv(config_, transports)),
      executor_(data_ctx_, reducers_, timeline_),
      control_(control_ctx_) {
  // Every rank constructs its engine in init(), so this collective lines up.
  if (config_.calibrate) reducers_.calibrate(data_ctx_);
  control_thread_ = std::thread([this] { controlLoop(); });
  executor_thread_ = std::thread([this] { executorLoop(); });
}

Engine::~Engine() { shutdown(); }

ReducerEnv Engine::reducerEnv(const Config& config, const Transports& t) {
  ReducerEnv env;
  env.ring = RingOptions{config.ring_segment_bytes, config.ring_window};
  env.central = CentralOptions{config.central_shards, config.ring_segment_bytes};
  if (config.shm && !t.shm_token.empty()) env.shm_prefix = makeShmPrefix(t.shm_token + "n");
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

void Engine::warn(const std::string& msg) { std::fprintf(stderr, "%s\n", msg.c_str()); }

int64_t Engine::submit(EntryPtr entry) {
  const Request& req = entry->request;
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.empty()) throw CollectiveError(failure_);
  if (shutdown_requested_ || stopped_)
    throw CollectiveError(strCat("rank ", topo().rank, ": hvdtorch has been shut down; call hvdtorch.init() again"));
  if (!pending_names_.insert(req.name).second)
    throw InvalidArgument(strCat("rank ", topo().rank, ": ", opTypeName(req.type), " named '", req.name,
                                 "' is already pending; names of outstanding ops must be unique"));
  // The name stays taken until the op finishes (not merely until it is
  // negotiated): a second op of the same name could otherwise be accepted
  // while the first one still runs, and the two would be matched with the
  // wrong peers' ops.
  entry->state->setOnDone([this, name = req.name] {
    std::lock_guard<std::mutex> lock(mu_);
    pending_names_.erase(name);
  });
  const int64_t handle = next_handle_++;
  handles_.emplace(handle, entry->state);
  timeline_.begin(req.name, "NEGOTIATE");
  incoming_.push_back(std::move(entry));
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
  std::lock_guard<std::mutex> lock(mu_);
  handles_.erase(handle);
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
  timeline_.close();
}

void Engine::failEverything(const std::string& why) {
  std::deque<EntryPtr> incoming;
  std::deque<WorkUnit> queued;
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
  for (auto& e : incoming) e->state->fail(why);
  for (auto& u : queued)
    for (auto& p : u.pieces) p.entry->state->fail(why);
}

void Engine::controlLoop() {
  ResponseCache cache(config_.cache_capacity);
  std::unique_ptr<Coordinator> coordinator;
  if (control_ctx_.rank() == 0)
    coordinator = std::make_unique<Coordinator>(control_ctx_.size(), config_.stall_warning, config_.timeout,
                                                [this](const std::string& m) { warn(m); });
  bool stop = false;
  while (!stop) {
    {
      // A rank with ops awaiting an answer runs a cycle every cycle_time. A
      // rank with nothing pending sleeps until it gets work: an op can only
      // become ready once every rank has submitted it, and then every rank
      // is polling. Idle ranks still join a cycle every kIdleWait, which
      // bounds how late they see stall warnings, timeouts and shutdown.
      constexpr auto kIdleWait = std::chrono::milliseconds(50);
      const bool waiting = !pending_.empty() || !cached_pending_.empty();
      std::unique_lock<std::mutex> lock(mu_);
      const auto wait = waiting ? config_.cycle_time : std::chrono::duration_cast<std::chrono::microseconds>(kIdleWait);
      incoming_cv_.wait_for(lock, wait, [&] { return !incoming_.empty() || shutdown_requested_; });
    }
    try {
      stop = [&] {
        runCycle(cache, coordinator.get());
        std::lock_guard<std::mutex> lock(mu_);
        return stopped_;
      }();
    } catch (const std::exception& e) {
      const std::string why = strCat("rank ", control_ctx_.rank(),
                                     ": lost contact with the other ranks during negotiation: ", e.what());
      failEverything(why);
      std::string reason;  // the first failure on this rank, which may predate this one
      {
        std::lock_guard<std::mutex> lock(mu_);
        reason = failure_;
      }
      if (coordinator) {
        // The other ranks only see rank 0 go away; tell them what it saw.
        ResponseList last;
        last.shutdown = true;
        last.shutdown_rank = control_ctx_.rank();
        last.shutdown_reason = reason;
        control_.sendLastWord(last.serialize(),
                              std::min<std::chrono::milliseconds>(config_.timeout, std::chrono::seconds(2)));
      }
      for (auto& [name, entry] : pending_) entry->state->fail(reason);
      pending_.clear();
      stop = true;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
}

void Engine::runCycle(ResponseCache& cache, Coordinator* coordinator) {
  const int me = control_ctx_.rank();
  RankMessage msg;
  std::deque<EntryPtr> fresh;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fresh.swap(incoming_);
    msg.shutdown = shutdown_requested_ || !failure_.empty();
    msg.failure = failure_;
  }
  for (auto& e : fresh) {
    const int id = cache.lookup(e->request);
    if (id >= 0) {
      cached_pending_[static_cast<uint32_t>(id)] = e->request.name;
    } else {
      msg.uncached.push_back(e->request);
    }
    pending_[e->request.name] = std::move(e);
  }
  msg.cache_bits.assign(cache.words(), 0);
  for (const auto& [id, name] : cached_pending_) msg.cache_bits[id / 64] |= uint64_t(1) << (id % 64);

  const std::vector<char> reply = control_.exchange(msg.serialize(), [&](std::vector<std::vector<char>>& all) {
    std::vector<RankMessage> msgs;
    msgs.reserve(all.size());
    for (const auto& bytes : all) msgs.push_back(RankMessage::parse(bytes));
    return coordinator->process(msgs, cache, Coordinator::Clock::now()).serialize();
  });
  const ResponseList list = ResponseList::parse(reply);

  std::vector<ReadyOp> ready;
  auto take = [&](const std::string& name) -> EntryPtr {
    auto it = pending_.find(name);
    if (it == pending_.end()) return nullptr;
    EntryPtr e = std::move(it->second);
    pending_.erase(it);
    const int id = cache.idOf(name);
    if (id >= 0) cached_pending_.erase(static_cast<uint32_t>(id));
    return e;
  };
  for (uint32_t id : list.cached_ready) {
    // Every rank submitted exactly the cached request, so its plan follows.
    const Request& cached = cache.at(id);
    Response s;
    s.type = cached.type;
    s.name = cached.name;
    s.process_set_id = cached.process_set_id;
    if (planIndexFor(cached.type) != 0)
      s.plan = makePlan(std::vector<const Request*>(control_ctx_.size(), &cached));
    ready.push_back({std::move(s), take(cached.name)});
  }
  for (const Response& s : list.responses) {
    EntryPtr e = take(s.name);
    // Every rank holds this op when it succeeded, so every rank makes the
    // same cache update in the same order.
    if (e && s.error.empty()) cache.put(e->request);
    ready.push_back({s, std::move(e)});
  }
  if (!ready.empty()) {
    for (const auto& op : ready) {
      if (!op.entry) continue;
      timeline_.end(op.entry->request.name, "NEGOTIATE");
      timeline_.begin(op.entry->request.name, "QUEUE");
    }
    std::vector<WorkUnit> units = planWork(ready, config_.fusion_threshold);
    {
      std::lock_guard<std::mutex> lock(exec_mu_);
      for (auto& u : units) exec_queue_.push_back(std::move(u));
    }
    exec_cv_.notify_one();
  }

  if (list.shutdown) {
    // Name the rank that stopped and, when it stopped on an error, that error:
    // "shut down" alone would hide the real cause from everyone else.
    const std::string reason =
        list.shutdown_reason.empty()
            ? strCat("hvdtorch was shut down (shutdown() called on rank ", list.shutdown_rank,
                     ") while this op was pending")
            : (list.shutdown_rank == me ? list.shutdown_reason
                                        : strCat("stopped because rank ", list.shutdown_rank,
                                                 " failed: ", list.shutdown_reason));
    auto failPending = [&](const EntryPtr& e) {
      e->state->fail(strCat("rank ", me, ": ", e->request.describe(), ": ", reason));
    };
    for (auto& [name, entry] : pending_) failPending(entry);
    pending_.clear();
    cached_pending_.clear();
    std::deque<EntryPtr> late;
    {
      std::lock_guard<std::mutex> lock(mu_);
      late.swap(incoming_);
      pending_names_.clear();
      stopped_ = true;
      if (!list.shutdown_reason.empty() && failure_.empty()) failure_ = strCat("rank ", me, ": ", reason);
    }
    for (auto& e : late) failPending(e);
  }
}

void Engine::executorLoop() {
  while (true) {
    WorkUnit unit;
    {
      std::unique_lock<std::mutex> lock(exec_mu_);
      exec_cv_.wait(lock, [&] { return !exec_queue_.empty() || exec_stop_; });
      if (exec_queue_.empty()) return;  // stop requested and everything drained
      unit = std::move(exec_queue_.front());
      exec_queue_.pop_front();
    }
    std::string failure;
    {
      std::lock_guard<std::mutex> lock(mu_);
      failure = failure_;
    }
    const Request& req = unit.pieces.front().entry->request;
    try {
      if (!failure.empty()) {
        for (auto& p : unit.pieces) p.entry->state->fail(failure);
        continue;
      }
      executor_.run(unit);
    } catch (const InvalidArgument& e) {
      for (auto& p : unit.pieces) p.entry->state->fail(strCat("rank ", data_ctx_.rank(), ": ", e.what()));
    } catch (const std::exception& e) {
      const std::string why = strCat("rank ", data_ctx_.rank(), ": ", opTypeName(unit.type), " '", req.name,
                                     "' failed: ", e.what());
      for (auto& p : unit.pieces) p.entry->state->fail(why);
      failEverything(why);
      incoming_cv_.notify_all();  // the control thread tells the other ranks
    }
  }
}

}  // namespace hvdtorch
