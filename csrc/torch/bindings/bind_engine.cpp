// _C.Engine (py_engine.h) and the ops: each op's options struct
// (csrc/core/ops/<op>.h) bound as it is, _C.<Op>Options, and its
// Engine.submit overload, for every op HVDTORCH_OPS lists
// (engine/op_spec.h): Python fills the struct and hands it to Engine.submit
// with the op's tensors.
#include <torch/extension.h>

#include <tuple>

#include "bindings/bind_field.h"
#include "bindings/bindings.h"
#include "bindings/py_engine.h"
#include "ops/all_ops.h"  // generated (CMakeLists.txt): every header of csrc/core/ops/
#include "registered_tensor.h"
#include "transport/shm/registered_memory.h"

namespace py = pybind11;

namespace hvdtorch {

namespace {

// Binds one op: its options struct as _C.<name>, default-constructed, with
// every plain field its fields() lists (ops/option_fields.h), and the
// overload Engine.submit(options, inputs, outputs) that submits it
// (PyEngine::submit). Tensors are never fields on the Python side.
template <typename Options, int64_t (*Entry)(Engine&, Options)>
void bindOp(py::module& m, py::class_<PyEngine>& engine, const char* name) {
  engine.def("submit", &PyEngine::submit<Options, Entry>, py::arg("options"),
             py::arg("inputs") = std::vector<at::Tensor>{}, py::arg("outputs") = std::vector<at::Tensor>{});
  py::class_<Options> c(m, name);
  c.def(py::init<>());
  std::apply([&c](const auto&... f) { (bindField(c, f), ...); }, Options::fields());
}

}  // namespace

void bindEngine(py::module_& m) {
  py::class_<PyEngine> engine(m, "Engine");
  engine
      .def(py::init<const std::map<std::string, std::string>&, int, const std::vector<int>&,
                    c10::intrusive_ptr<c10d::ProcessGroup>, c10::intrusive_ptr<c10d::ProcessGroup>, const std::string&,
                    std::optional<c10::intrusive_ptr<c10d::ProcessGroup>>>(),
           py::arg("options"), py::arg("rank"), py::arg("host_of_rank"), py::arg("control_pg"), py::arg("data_pg"),
           py::arg("shm_token"), py::arg("device_pg") = py::none(),
           // Building the engine waits for every peer: other Python threads
           // (a user's watchdog, a timer) must be able to run meanwhile.
           py::call_guard<py::gil_scoped_release>())
      .def("add_process_set", &PyEngine::addProcessSet, py::arg("ranks"), py::arg("host_pg") = py::none(),
           py::arg("device_pg") = py::none())
      .def("remove_process_set", &PyEngine::removeProcessSet)
      .def("process_sets", &PyEngine::processSets)
      .def("poll", &PyEngine::poll)
      .def("wait", &PyEngine::wait)
      .def("shutdown", &PyEngine::shutdown)
      .def("start_timeline", &PyEngine::startTimeline)
      .def("stop_timeline", [](PyEngine& e) { e.engine()->timeline().stop(); })
      .def("topology", &PyEngine::topology)
      .def("choose_reducer", &PyEngine::chooseReducer)
      .def("link_kinds", &PyEngine::linkKinds)
      .def("cost_model", &PyEngine::costModel)
      .def("reducer_choices", &PyEngine::reducerChoices)
      .def("link_cost", &PyEngine::linkCost)
      .def("negotiation_stats", &PyEngine::negotiationStats)
      // Run-time settings for autotune (engine.h: when a change is safe).
      .def("fusion_threshold", [](PyEngine& e) { return e.engine()->fusionThreshold(); })
      .def("set_fusion_threshold", [](PyEngine& e, size_t bytes) { e.engine()->setFusionThreshold(bytes); })
      .def("cycle_time_ms", [](PyEngine& e) { return e.engine()->cycleTime().count() / 1000.0; })
      .def("set_cycle_time_ms",
           [](PyEngine& e, double ms) {
             if (!(ms >= 0)) throw InvalidArgument(strCat("cycle time must be a non-negative number of ms, got ", ms));
             e.engine()->setCycleTime(std::chrono::microseconds(static_cast<int64_t>(ms * 1000)));
           })
      // A zero-filled 1-D CPU tensor in registered memory (what
      // DistributedModel's buckets use); plain memory where there is none.
      .def("registered_zeros",
           [](PyEngine& e, int64_t numel, py::object dtype) {
             return registeredZeros(*e.engine(), numel, torch::python::detail::py_object_to_dtype(dtype));
           })
      // (own live buffers, mapped peer buffers); (0, 0) without registered memory.
      .def("registered_stats",
           [](PyEngine& e) {
             const auto& r = e.engine()->registered();
             return r ? std::make_pair(r->ownBuffers(), r->peerMappings()) : std::make_pair(size_t(0), size_t(0));
           })
      .def("fusion_buffer_bytes", [](PyEngine& e) { return e.engine()->fusionBufferBytes(); })
      // {setting: value} as the engine's parts run with it (Engine::settingsInUse).
      .def("settings_in_use", [](PyEngine& e) { return e.engine()->settingsInUse(); })
      .def("latency_phases", &PyEngine::latencyPhases, py::arg("clear") = false);

  // The ops: each options struct (csrc/core/ops/<op>.h) and its
  // Engine.submit overload, for every op HVDTORCH_OPS lists
  // (engine/op_spec.h). The hottest op, the all-reduce, first: pybind tries
  // the overloads in this order.
#define HVDTORCH_BIND_OP(Op, op) bindOp<ops::Op##Options, ops::op>(m, engine, #Op "Options");
  HVDTORCH_OPS(HVDTORCH_BIND_OP)
#undef HVDTORCH_BIND_OP

  // Phases recorded from Python on the engine's timeline clock (DistributedModel's FORWARD and BACKWARD, so
  // that a trace shows how communication overlaps compute). No-ops while no timeline is written.
  m.def("timeline_enabled", [](PyEngine& e) { return e.engine()->timeline().enabled(); });
  m.def("timeline_begin",
        [](PyEngine& e, const std::string& op, const std::string& phase) { e.engine()->timeline().begin(op, phase); });
  m.def("timeline_end",
        [](PyEngine& e, const std::string& op, const std::string& phase) { e.engine()->timeline().end(op, phase); });
}

}  // namespace hvdtorch
