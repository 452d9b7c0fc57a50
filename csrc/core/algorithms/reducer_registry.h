// The table of reducers: the one place that names them (but for the help of
// the REDUCER knob, config/ being below algorithms/). Parsing names, the
// `auto` choice, calibration, the choice for registered buffers reduced in
// place (registeredReducer, ReducerSet::forRequest) and the Python side
// (_C.reducer_registry(): hvdtorch/check.py, the tests, benchmarks and
// examples) all read the table. Adding a reducer:
// docs/architecture.md, "Recipes".
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/central_allreduce.h"
#include "algorithms/reducer.h"
#include "algorithms/ring_allreduce.h"

namespace hvdtorch {

class RegisteredMemory;

// What the factories may use to build their reducer.
struct ReducerEnv {
  RingOptions ring;
  CentralOptions central;
  // Job-unique prefix for shared-memory segments (makeShmPrefix); empty when
  // shared memory is off (HVDTORCH_SHM=0) or the job has no token.
  std::string shm_prefix;
  // The process's registered buffers, which the node reducer reduces in
  // place; null: none.
  std::shared_ptr<RegisteredMemory> registered;
};

struct ReducerEntry {
  const char* name;
  // Builds the reducer for this job, or returns null when it cannot run here.
  std::unique_ptr<Reducer> (*make)(const ReducerEnv& env);
  // Why make() returned null, for the error of an explicit request.
  const char* unavailable;
  // The cost model's prior: alpha (seconds) and beta (seconds per byte) of
  // an all-reduce, assumed until measured (cost_model.h).
  double alpha;
  double beta;
  // Whether `auto` may choose it (and calibrate() measures it) for the
  // dtypes and ops it serves (Reducer::autoCandidate).
  bool automatic;
  // The reduce op this reducer defines rather than merely implements
  // (Adasum), if any: asking for the reducer by name turns a Sum or Average
  // all-reduce into that op.
  std::optional<ReduceOp> own_op;
  // Whether calibrate() times it at init. False for one whose small messages
  // cost milliseconds, which would make every init() slow: the real ops then
  // measure it (CostModel's exploration).
  bool measure_at_init = true;
};

// Indexed by ReducerId.
const std::vector<ReducerEntry>& reducerRegistry();

// "auto" or "" -> kAutoReducer, a registered name -> its id; anything else
// throws InvalidArgument listing the names.
ReducerId parseReducer(const std::string& name);
// "auto" for kAutoReducer.
const char* reducerName(ReducerId id);
// The reducer that reduces registered buffers (transport/shm/registered_memory.h)
// in place, with no copy on the host: the node reducer.
ReducerId registeredReducer();

}  // namespace hvdtorch
