// The process sets of one Engine (process_set.h): their ids, adding,
// removing and finding them, and equipping a member's set with what it runs
// on. The global set (id 0, every rank) is made with the table and uses the
// engine's own contexts, router, executor and control plane; another set gets
// views of the engine's contexts over its ranks and a router, executor and
// control plane of its own; every set its response cache, and its
// coordinator on its first rank.
//
// Ids are the smallest unused, so they agree across ranks because every rank
// adds and removes the same sets in the same order (the contract of
// Engine::addProcessSet). Threads: add() and remove() on a caller's thread,
// find() and snapshot() on any; mu_ guards the map only (a set's negotiation
// state is the control thread's, process_set.h). A removed set lives on
// while a snapshot or a queued unit (UnitSite) still holds it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/router.h"
#include "config/config.h"
#include "engine/execution/executor.h"
#include "engine/negotiation/control_plane.h"
#include "engine/process_set.h"
#include "timeline/timeline.h"
#include "transport/context.h"

namespace hvdtorch {

// The engine's own parts, from which every set's are made. Each outlives
// the table.
struct SetParts {
  const Config& config;
  const std::string& shm_token;  // names a set's shared-memory arena; empty: none
  std::shared_ptr<RegisteredMemory> registered;
  Timeline& timeline;
  Context& control;
  Context& data;
  Router& router;  // the global set's; its calibrated model seeds every other set's
  Executor& executor;
  ControlPlane& plane;
};

class ProcessSetTable {
 public:
  // Makes and equips the global set.
  explicit ProcessSetTable(const SetParts& parts);
  ProcessSetTable(const ProcessSetTable&) = delete;
  ProcessSetTable& operator=(const ProcessSetTable&) = delete;

  // Engine::addProcessSet and removeProcessSet (engine.h states their contracts).
  int32_t add(std::vector<int> ranks, NativeCollectives* native);
  void remove(int32_t id);
  // The set with this id, or null (never added, or removed).
  std::shared_ptr<ProcessSet> find(int32_t id) const;
  // Every set, in ascending ids (the global set first).
  std::vector<std::shared_ptr<ProcessSet>> snapshot() const;
  const std::shared_ptr<ProcessSet>& global() const { return global_; }
  static std::shared_ptr<ProcessSet> findIn(const std::vector<std::shared_ptr<ProcessSet>>& sets, int32_t id);

  // What a set's router and executor are made from, alike for every set's
  // (the Engine makes the global set's parts from them too).
  static ReducerEnv reducerEnv(const Config& config, const std::string& shm_token, int32_t set_id,
                               std::shared_ptr<RegisteredMemory> registered);
  static DeviceRouterOptions routerOptions(const Config& config);
  static ExecutorOptions executorOptions(const Config& config);

 private:
  // A set of `ranks` (ascending) as seen by global rank `rank`.
  static std::shared_ptr<ProcessSet> newSet(int32_t id, std::vector<int> ranks, int rank);
  // The one builder of a member's resources (see the top of this file).
  void equip(ProcessSet& ps);

  SetParts parts_;
  mutable std::mutex mu_;
  std::map<int32_t, std::shared_ptr<ProcessSet>> sets_;  // by id; 0 is the global set
  std::shared_ptr<ProcessSet> global_;
};

}  // namespace hvdtorch
