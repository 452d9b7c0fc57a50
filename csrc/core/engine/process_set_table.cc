#include "engine/process_set_table.h"

#include <algorithm>
#include <cstdio>

#include "common/error.h"
#include "transport/shm/segment.h"

namespace hvdtorch {

namespace {

// The coordinators' stall warnings.
void warn(const std::string& msg) { std::fprintf(stderr, "%s\n", msg.c_str()); }

}  // namespace

ProcessSetTable::ProcessSetTable(const SetParts& parts) : parts_(parts) {
  const Topology& topo = parts_.data.topo();
  std::vector<int> everyone(topo.size);
  for (int r = 0; r < topo.size; ++r) everyone[r] = r;
  global_ = newSet(0, std::move(everyone), topo.rank);
  equip(*global_);
  sets_.emplace(0, global_);
}

ReducerEnv ProcessSetTable::reducerEnv(const Config& config, const std::string& shm_token, int32_t set_id,
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

// The device router's part of the configuration (the device ring, the
// device calibration) and the executor's (the staging segments).
DeviceRouterOptions ProcessSetTable::routerOptions(const Config& config) {
  DeviceRouterOptions o;
  o.device_ring = {config.device_ring, config.device_ring_slot_bytes, config.device_ring_slots};
  o.calibration_bytes = config.device_calibration_bytes;
  return o;
}

ExecutorOptions ProcessSetTable::executorOptions(const Config& config) {
  ExecutorOptions o;
  o.staging_segment_bytes = config.staging_segment_bytes;
  return o;
}

int32_t ProcessSetTable::add(std::vector<int> ranks, NativeCollectives* native) {
  const Topology& t = parts_.data.topo();
  std::sort(ranks.begin(), ranks.end());
  if (ranks.empty()) throw InvalidArgument(strCat("rank ", t.rank, ": a process set needs at least one rank"));
  if (std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end())
    throw InvalidArgument(strCat("rank ", t.rank, ": a process set lists rank ",
                                 *std::adjacent_find(ranks.begin(), ranks.end()), " twice"));
  if (ranks.front() < 0 || ranks.back() >= t.size)
    throw InvalidArgument(strCat("rank ", t.rank, ": process set rank ",
                                 ranks.front() < 0 ? ranks.front() : ranks.back(), " is not a rank in [0, ", t.size,
                                 ")"));
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, other] : sets_)
    if (other->ranks == ranks)
      throw InvalidArgument(strCat("rank ", t.rank, ": ", other->describe(), " already has these ranks"));
  int32_t id = 1;
  while (sets_.count(id)) ++id;
  auto ps = newSet(id, std::move(ranks), t.rank);
  ps->native = native;
  if (ps->member()) equip(*ps);
  sets_.emplace(id, std::move(ps));
  return id;
}

std::shared_ptr<ProcessSet> ProcessSetTable::newSet(int32_t id, std::vector<int> ranks, int rank) {
  auto ps = std::make_shared<ProcessSet>();
  ps->id = id;
  ps->ranks = std::move(ranks);
  const auto me = std::find(ps->ranks.begin(), ps->ranks.end(), rank);
  ps->set_rank = me == ps->ranks.end() ? -1 : static_cast<int>(me - ps->ranks.begin());
  return ps;
}

void ProcessSetTable::equip(ProcessSet& ps) {
  const Config& config = parts_.config;
  if (ps.id == 0) {  // the engine's own parts
    ps.control = &parts_.control;
    ps.data = &parts_.data;
    ps.router = &parts_.router;
    ps.executor = &parts_.executor;
    ps.plane = &parts_.plane;
  } else {  // views of the engine's contexts, and parts of its own
    ps.own_control = Context::view(parts_.control, ps.ranks);
    ps.own_data = Context::view(parts_.data, ps.ranks, ps.native);
    ps.own_router = std::make_unique<Router>(
        *ps.own_data, reducerEnv(config, parts_.shm_token, ps.id, parts_.registered), routerOptions(config));
    // The job's calibration, alike on every member; the device routes' where
    // every member holds it (DeviceRouter::startFrom).
    ps.own_router->reducers().adoptModel(parts_.router.reducers().calibrated(), *ps.own_data);
    ps.own_router->startFrom(parts_.router);
    ps.own_executor = std::make_unique<Executor>(*ps.own_data, *ps.own_router, parts_.timeline, parts_.registered,
                                                 executorOptions(config));
    ps.own_plane = std::make_unique<ControlPlane>(*ps.own_control);
    ps.control = ps.own_control.get();
    ps.data = ps.own_data.get();
    ps.router = ps.own_router.get();
    ps.executor = ps.own_executor.get();
    ps.plane = ps.own_plane.get();
  }
  ps.site = {ps.executor, ps.id == 0 ? "" : " in " + ps.describe()};
  ps.cache = std::make_unique<ResponseCache>(config.cache_capacity);
  if (ps.set_rank == 0) {
    ps.coordinator =
        std::make_unique<Coordinator>(static_cast<int>(ps.ranks.size()), config.stall_warning, config.timeout, warn);
    if (ps.id != 0) ps.coordinator->setScope(ps.ranks, ps.describe());
  }
}

void ProcessSetTable::remove(int32_t id) {
  const int me = parts_.data.topo().rank;
  if (id == 0) throw InvalidArgument(strCat("rank ", me, ": the global process set (0) cannot be removed"));
  std::shared_ptr<ProcessSet> removed;
  {
    std::lock_guard<std::mutex> lock(mu_);
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

std::shared_ptr<ProcessSet> ProcessSetTable::find(int32_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<ProcessSet>> ProcessSetTable::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<ProcessSet>> out;
  out.reserve(sets_.size());
  for (const auto& [id, ps] : sets_) out.push_back(ps);
  return out;
}

std::shared_ptr<ProcessSet> ProcessSetTable::findIn(const std::vector<std::shared_ptr<ProcessSet>>& sets, int32_t id) {
  for (const auto& ps : sets)
    if (ps->id == id) return ps;
  return nullptr;
}

}  // namespace hvdtorch
