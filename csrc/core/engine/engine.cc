#include "engine/engine.h"

#include <thread>

#include "algorithms/device_ring.h"
#include "common/error.h"
#include "common/thread_placement.h"
#include "transport/shm/link.h"
#include "transport/shm/segment.h"
#include "transport/shm/wait.h"

namespace hvdtorch {

Engine::Engine(Config config, const Topology& topo, const Transports& transports, const std::vector<OpSpec>& ops)
    : config_(std::move(config)),
      timeline_(config_.timeline, topo.rank),
      control_ctx_(topo, transports.control, localLinks(config_, topo, transports, "c"), nullptr, config_.timeout),
      data_ctx_(topo, transports.data, localLinks(config_, topo, transports, "d"), transports.native, config_.timeout),
      registered_(makeRegistered(config_, topo, transports.shm_token)),
      router_(data_ctx_, ProcessSetTable::reducerEnv(config_, transports.shm_token, 0, registered_),
              ProcessSetTable::routerOptions(config_)),
      executor_(data_ctx_, router_, timeline_, registered_, ProcessSetTable::executorOptions(config_)),
      control_(control_ctx_),
      shm_token_(transports.shm_token),
      sets_(
          SetParts{config_, shm_token_, registered_, timeline_, control_ctx_, data_ctx_, router_, executor_, control_}),
      work_(st_, config_, data_ctx_.rank(), onMemberRouters(&Router::closeRings),
            onMemberRouters(&Router::releaseRingWaits)),
      controller_(config_, st_, sets_, work_, timeline_) {
  useOpTable(ops);
  // The host's online CPUs (0: unknown, which neither spins nor pins).
  const unsigned cores = std::thread::hardware_concurrency();
  // Shared-memory waits may spin a while when every rank of this host has
  // a core of its own (transport/shm/wait.h says why, and why not otherwise).
  setShmSpinBudget(cores != 0 && static_cast<unsigned>(topo.local_size) <= cores ? kShmSpinBudget
                                                                                 : std::chrono::microseconds(0));
  // Before the first engine thread starts (calibration below starts the
  // shared-memory senders): common/thread_placement.h says why.
  setEngineThreadCpus(engineThreadCpus(config_.thread_affinity, allowedCpus(), static_cast<int>(cores), topo.local_rank,
                                       topo.local_size));
  // Every rank constructs its engine in init(), so this collective lines up.
  if (config_.calibrate) router_.reducers().calibrate(data_ctx_);
  controller_.start();
  work_.start();
}

Engine::~Engine() { shutdown(); }

std::function<void()> Engine::onMemberRouters(void (Router::*what)()) {
  return [this, what] {
    for (const auto& ps : sets_.snapshot())
      if (ps->member() && ps->router) (ps->router->*what)();
  };
}

std::shared_ptr<RegisteredMemory> Engine::makeRegistered(const Config& config, const Topology& topo,
                                                         const std::string& shm_token) {
  if (!config.shm || shm_token.empty() || topo.local_size < 2) return nullptr;
  return std::make_shared<RegisteredMemory>(makeShmPrefix(shm_token + "g"), topo.rank, topo.local_ranks);
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

// ---- process sets: the table's (process_set_table.h) -------------------------

int32_t Engine::addProcessSet(std::vector<int> ranks, NativeCollectives* native) {
  return sets_.add(std::move(ranks), native);
}

void Engine::removeProcessSet(int32_t id) { sets_.remove(id); }

std::shared_ptr<const ProcessSet> Engine::processSet(int32_t id) const { return sets_.find(id); }

std::map<std::string, int64_t> Engine::settingsInUse() const {
  std::map<std::string, int64_t> s;
  s["cache_capacity"] = static_cast<int64_t>(sets_.global()->cache->capacity());
  s["staging_segment_bytes"] = static_cast<int64_t>(executor_.options().staging_segment_bytes);
  const ReducerSet& reducers = router_.reducers();
  for (size_t i = 0; i < reducers.size(); ++i) {
    const auto id = static_cast<ReducerId>(i);
    if (!reducers.available(id)) continue;
    const Reducer& r = reducers.get(id);
    for (const auto& [key, value] : r.settings()) s[strCat(r.name(), ".", key)] = value;
  }
  return s;
}

uint64_t Engine::deviceRingRuns() { return DeviceRing::runs(); }

std::vector<std::shared_ptr<const ProcessSet>> Engine::processSets() const {
  const auto sets = sets_.snapshot();
  return {sets.begin(), sets.end()};
}

// ---- ops and handles ---------------------------------------------------------

int64_t Engine::submit(EntryPtr entry) {
  const Request& req = entry->request;
  std::shared_ptr<ProcessSet> ps = sets_.find(req.process_set_id);
  if (!ps)
    throw InvalidArgument(strCat("rank ", topo().rank, ": ", opTypeName(req.type), " '", req.name, "': process set ",
                                 req.process_set_id, " does not exist (never added, or removed)"));
  if (!ps->member())
    throw InvalidArgument(strCat("rank ", topo().rank, ": ", opTypeName(req.type), " '", req.name,
                                 "': ", ps->describe(), " does not include this rank"));
  std::unique_lock<std::mutex> lock(st_.mu);
  if (!st_.failure.empty()) throw CollectiveError(strCat(req.describe(), ": ", st_.failure));
  if (!entry->inputs.empty())
    st_.device_index[entry->inputs.front()->device().kind] = entry->inputs.front()->device().index;
  if (st_.shutdown_requested || st_.stopped)
    throw CollectiveError(strCat("rank ", topo().rank, ": hvdtorch has been shut down; call hvdtorch.init() again"));
  std::string key = strCat(req.process_set_id, ":", req.name);
  if (!st_.pending_names.insert(key).second)
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
    std::lock_guard<std::mutex> lock(st_.mu);
    st_.pending_names.erase(key);
  });
  const int64_t handle = st_.next_handle++;
  st_.handles.emplace(handle, entry->state);
  timeline_.begin(req.name, "NEGOTIATE");
  entry->state->times.submitted = OpTimes::now();
  st_.incoming.push_back(std::move(entry));
  lock.unlock();  // the control thread wakes to take st_.mu: notify once it is free
  st_.incoming_cv.notify_one();
  return handle;
}

std::shared_ptr<OpState> Engine::state(int64_t handle) {
  std::lock_guard<std::mutex> lock(st_.mu);
  auto it = st_.handles.find(handle);
  if (it == st_.handles.end()) throw InvalidArgument(strCat("unknown or already released handle ", handle));
  return it->second;
}

void Engine::release(int64_t handle) {
  std::shared_ptr<OpState> st;
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    auto it = st_.handles.find(handle);
    if (it == st_.handles.end()) return;
    st = std::move(it->second);
    st_.handles.erase(it);
  }
  if (st->done()) latency_.add(st->times);
}

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    st_.shutdown_requested = true;
  }
  st_.incoming_cv.notify_all();
  controller_.join();
  work_.stop();
  work_.settleHeld();  // both threads are gone: nothing can bring a cause any more
  timeline_.close();
  // After a last word, keep the control links open a little: a peer that
  // was about to exchange with this rank reads the last word (and learns
  // the real cause) instead of finding the connection closed.
  std::this_thread::sleep_until(controller_.lingerUntil());
  // Nothing runs any more: let go of the transports now, not when the last
  // owner of this engine (a DistributedModel, say) goes away, so that
  // shutdown() leaves no process group thread or socket behind.
  control_ctx_.close();
  control_.dropPosted();
  data_ctx_.close();
}

}  // namespace hvdtorch
