// What Python reads of the configuration and the registries: the knobs
// (config/config.h, the one place they are parsed), the options resolved
// for the Python side, the reducer registry's rows, and the prefix of ops
// joined ranks never stand in for.
#include <torch/extension.h>

#include <chrono>
#include <tuple>

#include "bindings/bindings.h"
#include "common/error.h"
#include "config/config.h"
#include "engine/engine.h"
#include "engine/negotiation/coordinator.h"

namespace py = pybind11;

namespace hvdtorch {

void bindConfig(py::module_& m) {
  // The reducer registry (algorithms/reducer_registry.h), row by row: name,
  // the reduce op it defines itself (None for most), whether `auto` may pick
  // it, whether it is the one that reduces registered buffers in place
  // (registeredReducer()).
  m.def("reducer_registry", [] {
    py::list rows;
    const auto& table = reducerRegistry();
    for (size_t id = 0; id < table.size(); ++id) {
      const ReducerEntry& r = table[id];
      py::dict row;
      row["name"] = r.name;
      row["own_op"] = r.own_op ? py::object(py::str(reduceOpName(*r.own_op))) : py::object(py::none());
      row["automatic"] = r.automatic;
      row["registered"] = static_cast<ReducerId>(id) == registeredReducer();
      rows.append(row);
    }
    return rows;
  });
  // Ops named with this prefix are never stood in for by joined ranks
  // (engine/negotiation/coordinator.h): a joined rank submits them itself.
  m.attr("NO_STAND_IN_PREFIX") = std::string(kNoStandInPrefix);
  m.def("knobs", [] {
    std::vector<std::tuple<std::string, std::string, std::string>> out;
    for (const auto& k : Config::knobs()) out.emplace_back("HVDTORCH_" + k.name, k.default_value, k.help);
    return out;
  });
  // Validates the options (ValueError names a bad one: its variable, value and what it takes) and returns what the
  // Python side reads: the effective HVDTORCH_TIMEOUT in seconds
  // (torch.distributed gets the same deadline), HVDTORCH_HOSTNAME and the
  // autotune knobs. Config is the one place knobs are parsed.
  m.def("resolve_options", [](const std::map<std::string, std::string>& options) {
    const Config c = Config::load(options);
    // Config keeps the reducer's name (it knows no algorithm); the registry checks it, so a bad name fails
    // here, at init() on every rank and in `python -m hvdtorch.check`, not at the first all-reduce.
    try {
      parseReducer(c.reducer);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(strCat("HVDTORCH_REDUCER='", c.reducer, "': ", e.what()));
    }
    py::dict d;
    d["timeout"] = std::chrono::duration<double>(c.timeout).count();
    d["hostname"] = c.hostname;
    d["autotune"] = c.autotune;
    d["autotune_log"] = c.autotune_log;
    d["autotune_warmup_steps"] = c.autotune_warmup_steps;
    d["autotune_steps_per_trial"] = c.autotune_steps_per_trial;
    d["autotune_rounds"] = c.autotune_rounds;
    return d;
  });
}

}  // namespace hvdtorch
