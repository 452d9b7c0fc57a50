#include "algorithms/reducer_registry.h"

#include "algorithms/adasum_allreduce.h"
#include "algorithms/native_allreduce.h"
#include "algorithms/node_allreduce.h"
#include "common/error.h"

namespace hvdtorch {

const std::vector<ReducerEntry>& reducerRegistry() {
  // Priors until measured (they pick each size band's first `auto` choice):
  // loopback TCP through Gloo costs tens of microseconds per message and
  // about 1 GB/s; shared memory beats it at every size.
  static const std::vector<ReducerEntry> table = {
      {"ring",
       [](const ReducerEnv& env) -> std::unique_ptr<Reducer> { return std::make_unique<RingAllreduce>(env.ring); }, "",
       200e-6, 1.5e-9, true, std::nullopt},
      {"node",
       [](const ReducerEnv& env) -> std::unique_ptr<Reducer> {
         if (env.shm_prefix.empty()) return nullptr;
         return std::make_unique<NodeAllreduce>(NodeOptions{env.shm_prefix, size_t(4) << 20, env.ring, env.registered});
       },
       "the node reducer needs shared memory, which is off (HVDTORCH_SHM=0)", 20e-6, 0.5e-9, true, std::nullopt},
      {"central",
       [](const ReducerEnv& env) -> std::unique_ptr<Reducer> {
         return std::make_unique<CentralAllreduce>(env.central);
       },
       "", 150e-6, 4e-9, true, std::nullopt},
      // Through the c10d process group's work queue: 0.3-3 ms for 4 KiB over
      // loopback Gloo, so timed on real ops rather than at every init().
      {"native",
       [](const ReducerEnv& env) -> std::unique_ptr<Reducer> { return std::make_unique<NativeAllreduce>(env.ring); },
       "", 500e-6, 3e-9, true, std::nullopt, false},
      // Serves only op Adasum, so `auto` picks it exactly for that op.
      {"adasum", [](const ReducerEnv&) -> std::unique_ptr<Reducer> { return std::make_unique<AdasumAllreduce>(); }, "",
       300e-6, 3e-9, true, ReduceOp::kAdasum},
  };
  return table;
}

ReducerId parseReducer(const std::string& name) {
  if (name.empty() || name == "auto") return kAutoReducer;
  const auto& table = reducerRegistry();
  std::string names = "auto";
  for (size_t i = 0; i < table.size(); ++i) {
    if (name == table[i].name) return static_cast<ReducerId>(i);
    names += strCat(", ", table[i].name);
  }
  throw InvalidArgument(strCat("unknown reducer '", name, "': expected one of ", names));
}

const char* reducerName(ReducerId id) {
  if (id == kAutoReducer) return "auto";
  const auto& table = reducerRegistry();
  return id < table.size() ? table[id].name : "unknown";
}

ReducerId registeredReducer() {
  static const ReducerId id = parseReducer("node");
  return id;
}

}  // namespace hvdtorch
